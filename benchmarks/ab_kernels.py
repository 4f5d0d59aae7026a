"""A/B of the current SGMV kernels against earlier copies of them, in one process.

    mkdir -p .ab/base && for f in sgmv_shrink sgmv_expand sgmv_silu; do
        git show REV:multilora_cli/kernels/$f.py > .ab/base/$f.py; done          # an ignored, carried folder
    PYTHONPATH=. python3 benchmarks/ab_kernels.py --baseline .ab/base --out $OUT/ab-kernels.json

The baseline folder holds copies of kernels/sgmv_shrink.py, sgmv_expand.py and sgmv_silu.py (any subset); each
is loaded as its own module and swapped into `kernels.sgmv`, so both arms share everything else (blocks, PDL,
metadata). Per point: the layer as bench_kernels.py times it (add_lora on qkv, o, gate_up, down) and the gate_up
module as the engine runs it (shrink + expand fused with SiLU-and-mul). Same timing as bench_kernels.py (median
of CUDA-graph replays of K rotations, L2 cleared between replays); arms interleaved per point and repeated, min
taken; floor = bytes / copy bandwidth measured here. Outputs of the two arms are compared bit for bit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch

from bench_kernels import MODULES, Case, Pools, device_report, floor_bytes, graph_time_us, rotations_for, save_report
from multilora_cli.kernels import sgmv

NAMES = {"sgmv_shrink": "lora_shrink", "sgmv_expand": "lora_expand", "sgmv_silu": "lora_expand_silu_mul"}
CURRENT = {fn: getattr(sgmv, fn) for fn in NAMES.values()}


def load_baseline(folder: str) -> dict:
    """function name -> the baseline copy's function (current where the folder has no copy)."""
    out = dict(CURRENT)
    for mod, fn in NAMES.items():
        path = os.path.join(folder, f"{mod}.py")
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(f"{mod}_base", path)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            out[fn] = getattr(m, fn)
    return out


def installer(fns: dict):
    def install():
        for fn, f in fns.items():
            setattr(sgmv, fn, f)

    return install


def silu_fn(case: Case, pools: Pools):
    def fn(i):
        r = case.rot[i]
        sgmv.add_lora_silu_mul_triton(r["y"]["gate_up"], r["x"]["gate_up"], pools.w["gate_up"][r["copy"]], r["meta"])

    return fn


def outputs(case: Case, pools: Pools, install) -> list[torch.Tensor]:
    install()
    r = case.rot[0]
    saved = {n: y.clone() for n, y in r["y"].items()}
    case.ours(0)
    h = sgmv.add_lora_silu_mul_triton(saved["gate_up"], r["x"]["gate_up"], pools.w["gate_up"][r["copy"]], r["meta"])
    torch.cuda.synchronize()
    out = [r["y"][n].clone() for n in MODULES] + [h]
    for n, y in r["y"].items():
        y.copy_(saved[n])
    return out


def time_arms(case: Case, pools: Pools, arms: dict, k: int, repeats: int) -> tuple[dict, dict]:
    """Per arm: whether its outputs equal the first arm's bit for bit, and the min over `repeats` interleaved
    rounds of the layer's and the SiLU path's graph times (us)."""
    ys = {name: outputs(case, pools, install) for name, install in arms.items()}
    ref = ys[next(iter(arms))]
    same = {name: all(torch.equal(u, v) for u, v in zip(ref, y)) for name, y in ys.items()}
    times = {f"{name} {what}": [] for name in arms for what in ("layer", "silu")}
    for _ in range(repeats):
        for name, install in arms.items():
            install()
            times[f"{name} layer"].append(graph_time_us(case.ours, k))
            times[f"{name} silu"].append(graph_time_us(silu_fn(case, pools), k))
    return same, {key: round(min(v), 2) for key, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="folder with earlier copies of sgmv_shrink/expand/silu.py")
    p.add_argument("--points", default="256,64,16;256,16,16;64,64,16;16,8,16;1,1,16;1024,64,16;4096,64,16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pool-rank", type=int, default=16, help="max_rank of the slot pool (ranks below it are masked)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(rows=[])
    arms = {"base": installer(load_baseline(args.baseline)), "current": installer(CURRENT)}
    pools = Pools(4, 64, args.pool_rank)
    report["pool_rank"] = args.pool_rank
    for point in args.points.split(";"):
        t, a, r = (int(v) for v in point.split(","))
        pools.set_rank(r)
        fb = floor_bytes(t, min(t, a), r)
        k = rotations_for(fb, l2)
        case = Case(pools, t, a, r, k)
        same, best = time_arms(case, pools, arms, k, args.repeats)
        row = dict(
            tokens=t,
            adapters=a,
            rank=r,
            floor_us=round(fb / bw * 1e6, 2),
            bit_identical=same["current"],
            **best,
            layer_ratio=round(best["current layer"] / best["base layer"], 3),
            silu_ratio=round(best["current silu"] / best["base silu"], 3),
        )
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        del case
    arms["current"]()
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
