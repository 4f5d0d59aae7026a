"""The one-launch SGMV kernel (sgmv_fused.py) against the two-launch pair (shrink, then expand), in one process.

    PYTHONPATH=. python3 benchmarks/ab_fused.py --out $OUT/ab-fused.json

Per point and Llama-3-8B module: the pair at the table's blocks, and the fused kernel over column-group widths
(each group re-reads its tile's A rows), K steps, warps and pipeline depths. Then the whole layer: the pair
everywhere, the fused kernel at each module's best blocks, and each module's faster of the two. Same timing
as bench_kernels.py (median of CUDA-graph replays of K rotations, L2 cleared between replays), arms
interleaved and repeated, min taken; floor = bytes / copy bandwidth measured here. Every fused arm's output is
checked against the pair's (relative error of the delta) before it is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench_kernels import (
    MODULES,
    Case,
    Pools,
    device_report,
    floor_bytes,
    graph_time_us,
    rotations_for,
    save_report,
)

from multilora_cli.kernels.blocks import FusedBlocks, expand_blocks, shrink_blocks
from multilora_cli.kernels.sgmv import add_lora_triton
from multilora_cli.kernels.sgmv_fused import add_lora_fused

GROUP_WIDTHS = {"qkv": (256, 512, 1024, 2048), "o": (256, 512, 1024, 2048, 4096),
                "gate_up": (1024, 2048, 4096, 8192), "down": (512, 1024, 2048, 4096)}


def candidates(n: str, bks: list[int], shapes: list[tuple[int, int]]) -> list[FusedBlocks]:
    out = []
    for gw in GROUP_WIDTHS[n]:
        cols = [(gw, 1)] if gw <= 512 else [(256, gw // 256), (128, gw // 128)]
        for bn, nb in cols:
            for bk in bks:
                for warps, stages in shapes:
                    out.append(FusedBlocks(bm=16, bk=bk, bn=bn, nb=nb, num_warps=warps, num_stages=stages))
    return out


def pair_fn(case: Case, pools: Pools, n: str):
    in_f, slices = MODULES[n]
    sb = shrink_blocks(case.t, in_f, len(slices), pools.pool_rank, 132)
    eb = expand_blocks(case.t, sum(slices), len(slices), pools.pool_rank, 132)

    def fn(i):
        r = case.rot[i]
        add_lora_triton(r["y"][n], r["x"][n], pools.w[n][r["copy"]], r["meta"], shrink=sb, expand=eb)
    return fn


def fused_fn(case: Case, pools: Pools, n: str, b: FusedBlocks):
    def fn(i):
        r = case.rot[i]
        add_lora_fused(r["y"][n], r["x"][n], pools.w[n][r["copy"]], r["meta"], b)
    return fn


def rel_err(case: Case, pools: Pools, n: str, b: FusedBlocks) -> float:
    r = case.rot[0]
    y0 = r["y"][n].clone()
    want, got = y0.clone(), y0.clone()
    w = pools.w[n][r["copy"]]
    add_lora_triton(want, r["x"][n], w, r["meta"], shrink=shrink_blocks(case.t, w.in_features, w.n_slices,
                                                                        w.max_rank, 132))
    add_lora_fused(got, r["x"][n], w, r["meta"], b)
    d = (want.double() - y0.double()).norm().item() or 1.0
    return (got.double() - want.double()).norm().item() / d


def timed(arms: dict, k: int, repeats: int) -> dict:
    times = {name: [] for name in arms}
    for _ in range(repeats):
        for name, fn in arms.items():
            times[name].append(graph_time_us(fn, k, rep_ms=30))
    return {name: round(min(v), 2) for name, v in times.items()}


def layer_fn(case: Case, pools: Pools, choice: dict):
    """The four modules back to back: choice[n] = FusedBlocks (fused) or None (the pair at the table)."""
    fns = {n: (fused_fn(case, pools, n, b) if b else pair_fn(case, pools, n)) for n, b in choice.items()}

    def fn(i):
        for n in MODULES:
            fns[n](i)
    return fn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256,64,16;256,16,16;64,64,16;16,8,16;1,1,16")
    p.add_argument("--bks", default="128,256")
    p.add_argument("--shapes", default="4,2;4,3;4,4;8,3", help="warps,stages pairs")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=520)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    bks = [int(v) for v in args.bks.split(",")]
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    l2, bw, report = device_report(rows=[], layers=[])
    pools = Pools(4, 64, 16)
    pools.set_rank(16)
    for point in args.points.split(";"):
        if time.time() - start > args.budget_s:
            print("budget reached", flush=True)
            break
        t, a, r = (int(v) for v in point.split(","))
        best = {}
        for n in MODULES:
            k = rotations_for(floor_bytes(t, min(t, a), r) // 4, l2)
            case = Case(pools, t, a, r, k)
            arms = {"pair": pair_fn(case, pools, n)}
            errs = {}
            for b in candidates(n, bks, shapes):
                name = f"gw{b.bn * b.nb} bn{b.bn} bk{b.bk} w{b.num_warps} s{b.num_stages}"
                errs[name] = rel_err(case, pools, n, b)
                arms[name] = fused_fn(case, pools, n, b)
            bad = {k2: v for k2, v in errs.items() if v > 1e-2}
            times = timed(arms, k, args.repeats)
            fused = {k2: v for k2, v in times.items() if k2 != "pair"}
            top = min(fused, key=fused.get)
            best[n] = candidates(n, bks, shapes)[list(fused).index(top)]
            row = dict(tokens=t, adapters=a, rank=r, module=n, pair_us=times["pair"], best=top,
                       best_us=fused[top], max_rel_err=max(errs.values()), bad=bad, times=times)
            report["rows"].append(row)
            print(json.dumps({k2: v for k2, v in row.items() if k2 != "times"}), flush=True)
            del case
        mixed = {n: (best[n] if report["rows"][-4 + i]["best_us"] < report["rows"][-4 + i]["pair_us"] else None)
                 for i, n in enumerate(MODULES)}
        k = rotations_for(floor_bytes(t, min(t, a), r), l2)
        case = Case(pools, t, a, r, k)
        lay = timed({"pair": layer_fn(case, pools, {n: None for n in MODULES}),
                     "fused": layer_fn(case, pools, best), "mixed": layer_fn(case, pools, mixed)}, k, args.repeats + 1)
        row = dict(tokens=t, adapters=a, rank=r, floor_us=round(floor_bytes(t, min(t, a), r) / bw * 1e6, 2),
                   best={n: str(b) for n, b in best.items()}, fused_modules=[n for n, b in mixed.items() if b],
                   **lay)
        report["layers"].append(row)
        print(json.dumps(row), flush=True)
        del case
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
