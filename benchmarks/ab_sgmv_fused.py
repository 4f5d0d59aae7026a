"""A/B in one process: SGMV in one launch (sgmv_fused.py) vs two launches (shrink + expand), Llama-3-8B layer.

    PYTHONPATH=. python3 benchmarks/ab_sgmv_fused.py --out benchmarks/results/kernels-fused-<device>.json

Same pools, cases and timing as bench_kernels.py (medians of CUDA-graph replays of K rotations, L2 cleared
between replays). Per point: the whole layer both ways (interleaved, twice, min of the two), per-module
times both ways, and at --sweep points a block-size sweep of the fused kernel per module. Before timing,
each point checks that both ways give bit-identical y.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from bench_kernels import MODULES, Case, Pools, bandwidth, floor_bytes, graph_time_us, ints, rotations_for
from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks, expand_blocks, shrink_blocks
from multilora_cli.kernels.sgmv import add_lora_triton


def layer(case: Case, fused: bool, modules=MODULES, blocks=None):
    def fn(k):
        r = case.rot[k]
        for n in modules:
            w = case.pools.w[n][r["copy"]]
            sb, eb = (blocks or {}).get(n, (None, None))
            add_lora_triton(r["y"][n], r["x"][n], w, r["meta"], shrink=sb, expand=eb, fused=fused)
    return fn


def same_output(case: Case) -> bool:
    r = case.rot[0]
    ok = True
    for n in MODULES:
        w = case.pools.w[n][r["copy"]]
        y1, y2 = r["y"][n].clone(), r["y"][n].clone()
        add_lora_triton(y1, r["x"][n], w, r["meta"], fused=False)
        add_lora_triton(y2, r["x"][n], w, r["meta"], fused=True)
        ok &= torch.equal(y1, y2)
    torch.cuda.synchronize()
    ok &= int(r["meta"].counters.abs().sum()) == 0
    return bool(ok)


def candidates(t: int, in_f: int, slices: list[int], pool_rank: int):
    s0 = shrink_blocks(t, in_f, len(slices), pool_rank, 132)
    e0 = expand_blocks(t, sum(slices), len(slices), pool_rank, 132)
    out = {(s0, e0)}
    steps = in_f // s0.bk
    for split in (1, 2, 4, 8, 16, 32):
        if steps % split == 0:
            out.add((ShrinkBlocks(s0.bm, s0.bk, split, s0.num_warps, s0.num_stages), e0))
    for bn, nb in ((64, 1), (128, 1), (128, 2), (128, 4), (256, 1), (256, 2)):
        out.add((s0, ExpandBlocks(e0.bm, bn, nb, e0.num_warps, e0.num_stages)))
    out.add((ShrinkBlocks(s0.bm, s0.bk, s0.split, 8, s0.num_stages), ExpandBlocks(e0.bm, e0.bn, e0.nb, 8, e0.num_stages)))
    return sorted(out, key=str)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256,64,16;1,1,16;16,8,16;64,64,16;256,8,16;1024,64,16;4096,64,16;256,64,64")
    p.add_argument("--sweep", default="256,64,16;64,64,16;1024,64,16")
    p.add_argument("--pool-rank", type=int, default=64)
    p.add_argument("--max-loras", type=int, default=64)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    bw = bandwidth()
    report = dict(device=props.name, copy_bandwidth_Bps=round(bw), torch=torch.__version__, triton=triton.__version__,
                  command=" ".join(["python3"] + sys.argv), pool_rank=args.pool_rank, max_loras=args.max_loras,
                  points=[], modules={}, sweep=[])

    def save():
        report["elapsed_s"] = round(time.time() - start, 1)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)

    pools = Pools(args.copies, args.max_loras, args.pool_rank)
    for pt in [tuple(ints(s)) for s in args.points.split(";") if s]:
        if time.time() > start + args.budget_s:
            break
        t, a, r = pt
        pools.set_rank(r)
        fb = floor_bytes(t, min(t, a), r)
        k = rotations_for(fb, l2)
        case = Case(pools, t, a, r, k)
        same = same_output(case)
        two = min(graph_time_us(layer(case, False), k), graph_time_us(layer(case, False), k))
        one = min(graph_time_us(layer(case, True), k), graph_time_us(layer(case, True), k))
        floor_us = fb / bw * 1e6
        row = dict(tokens=t, adapters=a, rank=r, floor_us=round(floor_us, 2), two_launch_us=round(two, 2),
                   fused_us=round(one, 2), fused_over_two=round(one / two, 3), two_over_floor=round(two / floor_us, 3),
                   fused_over_floor=round(one / floor_us, 3), bit_identical=same)
        mods = {}
        for n in MODULES:
            mods[n] = dict(two=round(graph_time_us(layer(case, False, [n]), k), 2),
                           fused=round(graph_time_us(layer(case, True, [n]), k), 2))
        row["modules"] = mods
        report["points"].append(row)
        print(json.dumps(row), flush=True)
        save()
        del case
    for pt in [tuple(ints(s)) for s in args.sweep.split(";") if s]:
        t, a, r = pt
        pools.set_rank(r)
        k = rotations_for(floor_bytes(t, min(t, a), r) // 4, l2)
        case = Case(pools, t, a, r, k)
        for n, (in_f, slices) in MODULES.items():
            for sb, eb in candidates(t, in_f, slices, args.pool_rank):
                if time.time() > start + args.budget_s:
                    save()
                    return 0
                try:
                    us = graph_time_us(layer(case, True, [n], {n: (sb, eb)}), k, rep_ms=30)
                except Exception as e:  # noqa: BLE001 - a candidate that does not compile is skipped
                    print(f"skip {n} {sb} {eb}: {type(e).__name__} {str(e)[:100]}", flush=True)
                    continue
                row = dict(tokens=t, adapters=a, rank=r, module=n, shrink=str(sb), expand=str(eb), us=round(us, 2))
                report["sweep"].append(row)
                print(json.dumps(row), flush=True)
        save()
        del case
    save()
    print(f"done in {time.time() - start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
