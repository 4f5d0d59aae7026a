"""The shrink's K-split count, timed jointly with the expand that sums its partials, in one process.

    PYTHONPATH=. python3 benchmarks/ab_split.py --out $OUT/ab-split.json

Sweeps 1-4 (bench_kernels.py --sweep) timed each kernel alone: a shrink candidate's split was judged by the
shrink's time only, although every partial it writes is one more fp32 [BM, R] block the expand must read from
L2 before its first FMA. Here, per Llama-3-8B module and point, each split in --splits is timed three ways
(shrink alone, expand alone over that many random partials, the pair as `add_lora_triton` runs it), then the
whole layer at the table's splits against the layer at each module's best pair. Same timing as
bench_kernels.py (median of CUDA-graph replays of K rotations, L2 cleared between replays), arms interleaved and
repeated, min taken; floor = bytes / copy bandwidth measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench_kernels import MODULES, Case, Pools, device_report, floor_bytes, graph_time_us, rotations_for, save_report
from multilora_cli.kernels.blocks import ShrinkBlocks, expand_blocks, shrink_blocks
from multilora_cli.kernels.sgmv import add_lora_triton
from multilora_cli.kernels.sgmv_expand import lora_expand
from multilora_cli.kernels.sgmv_shrink import lora_shrink


def with_split(b: ShrinkBlocks, split: int) -> ShrinkBlocks:
    return ShrinkBlocks(b.bm, b.bk, split, b.num_warps, b.num_stages)


def module_arms(case: Case, pools: Pools, n: str, splits: list[int]) -> dict:
    """name -> fn(rotation) for one module: shrink / expand / pair per split (splits that divide K evenly)."""
    in_f, slices = MODULES[n]
    t = case.t
    table = shrink_blocks(t, in_f, len(slices), pools.pool_rank, 132)
    eb = expand_blocks(t, sum(slices), len(slices), pools.pool_rank, 132)
    arms = {}
    for split in splits:
        if (in_f // table.bk) % split:
            continue
        sb = with_split(table, split)
        parts = [torch.randn((split, t, len(slices), pools.pool_rank), device="cuda") for _ in case.rot]
        scratch = [torch.empty_like(p) for p in parts]

        def w_of(i):
            return pools.w[n][case.rot[i]["copy"]]

        def shrink(i, sb=sb, scratch=scratch):
            r = case.rot[i]
            lora_shrink(r["x"][n], w_of(i), r["meta"], scratch[i], sb)

        def expand(i, parts=parts):
            r = case.rot[i]
            lora_expand(parts[i], w_of(i), r["meta"], r["y"][n], eb, after_shrink=False)

        def pair(i, sb=sb):
            r = case.rot[i]
            add_lora_triton(r["y"][n], r["x"][n], w_of(i), r["meta"], shrink=sb)

        tag = f"s{split}" + ("*" if split == table.split else "")
        arms.update({f"{tag} shrink": shrink, f"{tag} expand": expand, f"{tag} pair": pair})
    return arms


def layer_fn(case: Case, pools: Pools, splits: dict):
    """The four modules back to back, module n's shrink at splits[n] (None: the table)."""

    def fn(i):
        r = case.rot[i]
        for n, (in_f, slices) in MODULES.items():
            sb = None
            if splits.get(n):
                sb = with_split(shrink_blocks(case.t, in_f, len(slices), pools.pool_rank, 132), splits[n])
            add_lora_triton(r["y"][n], r["x"][n], pools.w[n][r["copy"]], r["meta"], shrink=sb)

    return fn


def timed(arms: dict, k: int, repeats: int) -> dict:
    times = {name: [] for name in arms}
    for _ in range(repeats):
        for name, fn in arms.items():
            times[name].append(graph_time_us(fn, k, rep_ms=40))
    return {name: round(min(v), 2) for name, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256,64,16;256,16,16;64,64,16;16,8,16")
    p.add_argument("--splits", default="1,2,4,8,16,32")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    splits = [int(v) for v in args.splits.split(",")]
    l2, bw, report = device_report(rows=[], layers=[])
    pools = Pools(4, 64, 16)
    pools.set_rank(16)
    for point in args.points.split(";"):
        t, a, r = (int(v) for v in point.split(","))
        best = {}
        for n in MODULES:
            k = rotations_for(floor_bytes(t, min(t, a), r) // 4, l2)
            case = Case(pools, t, a, r, k)
            row = dict(
                tokens=t, adapters=a, rank=r, module=n, **timed(module_arms(case, pools, n, splits), k, args.repeats)
            )
            pairs = {key: v for key, v in row.items() if key.endswith(" pair")}
            best[n] = int(min(pairs, key=pairs.get).split()[0].strip("s*"))
            row["best_split"] = best[n]
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            del case
        k = rotations_for(floor_bytes(t, min(t, a), r), l2)
        case = Case(pools, t, a, r, k)
        lay = timed({"table": layer_fn(case, pools, {}), "best": layer_fn(case, pools, best)}, k, args.repeats + 1)
        row = dict(
            tokens=t,
            adapters=a,
            rank=r,
            best_splits=best,
            floor_us=round(floor_bytes(t, min(t, a), r) / bw * 1e6, 2),
            **lay,
        )
        report["layers"].append(row)
        print(json.dumps(row), flush=True)
        del case
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
