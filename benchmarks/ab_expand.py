"""A/B of the SGMV expand against an earlier version of it, in one process (kernels/sgmv_expand.py).

    git show REV:multilora_cli/kernels/sgmv_expand.py > .ab/sgmv_expand_base.py   # an ignored, carried folder
    PYTHONPATH=. python3 benchmarks/ab_expand.py --baseline .ab/sgmv_expand_base.py --out $OUT/ab-expand.json

Same timing as bench_kernels.py (median of CUDA-graph replays of K rotations of one Llama-3-8B layer, L2
cleared between replays, floor = bytes / copy bandwidth measured in this run). Arms, interleaved per point and
repeated so device drift hits each alike: the baseline file's `lora_expand`; the current one as `add_lora_triton`
launches it (after_shrink: B and y loaded before gdc_wait); the current one without that ("late"); the current
one with the shrink's K-split partials loaded at once at every size ("vec", S_VECTOR_MIN_TOKENS = 0). The shrink
is the current one in every arm. Also checks, per point, that the arms compute the same y (current and late
bit-identical; the relative difference to the baseline: 0 or fp32 summation-order rounding).
(Run 1 and 2 json files come from earlier arms of this script: EARLY_LOADS levels 0/1/2 = nothing / B / B and
y before the wait, loop / vector partial sums.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

import torch

from bench_kernels import MODULES, Case, Pools, device_report, floor_bytes, graph_time_us, module_times, rotations_for
from multilora_cli.kernels import sgmv, sgmv_expand

CURRENT = sgmv_expand.lora_expand
VECTOR_MIN_TOKENS = sgmv_expand.S_VECTOR_MIN_TOKENS


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("sgmv_expand_base", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def base(s, w, meta, y, blocks=None, after_shrink=False):  # older launchers know no after_shrink
        mod.lora_expand(s, w, meta, y, blocks)

    return base


def arms(baseline) -> dict:
    """name -> function that installs the arm: the baseline; the current expand as `add_lora_triton` runs it;
    the same without the loads before gdc_wait (what a bare `lora_expand` does); with K-split partials
    loaded at once at every size."""

    def late(s, w, meta, y, blocks=None, after_shrink=False):
        CURRENT(s, w, meta, y, blocks, after_shrink=False)

    def use(fn, vector_min_tokens=VECTOR_MIN_TOKENS):
        def install():
            sgmv.lora_expand = fn
            sgmv_expand.S_VECTOR_MIN_TOKENS = vector_min_tokens

        return install

    return {"base": use(baseline), "current": use(CURRENT), "late": use(late), "vec": use(CURRENT, 0)}


def outputs(case: Case, install) -> dict:
    """y of every module after one rotation from a fresh copy of the inputs (for the equality check)."""
    install()
    r = case.rot[0]
    saved = {n: y.clone() for n, y in r["y"].items()}
    case.ours(0)
    torch.cuda.synchronize()
    out = {n: y.clone() for n, y in r["y"].items()}
    for n, y in r["y"].items():
        y.copy_(saved[n])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a copy of an earlier sgmv_expand.py")
    p.add_argument(
        "--points",
        default="256,64,16;256,16,16;64,64,16;16,8,16;8,8,16;4,4,16;2,2,16;1,1,16;1024,64,16;4096,64,16;256,64,64",
    )
    p.add_argument("--pool-rank", type=int, default=16, help="max_rank of the pool (rank-64 points use 64)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(rows=[], modules=[])
    arm = arms(load_baseline(args.baseline))
    pools = {}
    for point in args.points.split(";"):
        t, a, r = (int(v) for v in point.split(","))
        pr = max(args.pool_rank, r)
        if pr not in pools:
            pools.clear()  # one pool set at a time (memory)
            pools[pr] = Pools(4, 64, pr)
        pool = pools[pr]
        pool.set_rank(r)
        fb = floor_bytes(t, min(t, a), r)
        k = rotations_for(fb, l2)
        case = Case(pool, t, a, r, k)
        ys = {name: outputs(case, install) for name, install in arm.items()}
        same_late = all(torch.equal(ys["current"][n], ys["late"][n]) for n in MODULES)
        rel = {
            e: max(
                ((ys[e][n].float() - ys["base"][n].float()).norm() / ys["base"][n].float().norm()).item()
                for n in MODULES
            )
            for e in ("current", "vec")
        }
        times = {name: [] for name in arm}
        for _ in range(args.repeats):
            for name, install in arm.items():
                install()
                times[name].append(graph_time_us(case.ours, k))
        floor_us = fb / bw * 1e6
        row = dict(
            tokens=t,
            adapters=a,
            rank=r,
            pool_rank=pr,
            floor_us=round(floor_us, 2),
            current_late_identical=same_late,
            **{f"rel_diff_{e}_vs_base": float(f"{v:.3g}") for e, v in rel.items()},
            **{f"{m}_us": round(min(v), 2) for m, v in times.items()},
            **{f"{m}_all": [round(x, 2) for x in v] for m, v in times.items()},
        )
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        if (t, a, r) == (256, 64, 16):  # where the time goes at the target, per module and arm
            report["modules"] = module_times(pool, t, a, r, l2, arm)
        del case
    arm["current"]()
    report["elapsed_s"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'point':>14} {'floor':>7} " + " ".join(f"{m:>8}" for m in arm))
    for row in report["rows"]:
        print(
            f"{row['tokens']:>5}/{row['adapters']:>3}/r{row['rank']:<3} {row['floor_us']:>7.1f} "
            + " ".join(f"{row[m + '_us']:>8.1f}" for m in arm)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
