"""A/B of the gate_up LoRA path: add_lora + silu_mul (two steps) vs the fused expand + SiLU-and-mul, one process.

    PYTHONPATH=. python3 benchmarks/ab_silu.py --out $OUT/ab-silu.json

Llama-3-8B gate_up (4096 -> 2 x 14336), bf16, rank 16, pool of 64 slots. Same timing as bench_kernels.py
(median of CUDA-graph replays of K rotations, L2 cleared between replays). Arms per point, interleaved and
repeated: "two-step" = shrink + expand (y += delta in place) + silu_mul; "fused" = shrink + the fused kernel at
the table's blocks and a few others; "silu only" = silu_mul alone (what a base-only layer pays). Floors: bytes
each path must move (adapters once, x once; two-step: y read + written by the expand, read by the activation;
fused: y read once; both write h) over copy bandwidth measured here. Also checks fused == two-step bit for bit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench_kernels import Case, Pools, device_report, graph_time_us, rotations_for
from multilora_cli.kernels import add_lora, add_lora_silu_mul, norm_rope
from multilora_cli.kernels.blocks import SiluBlocks, silu_blocks
from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton

IN_F, I = 4096, 14336


def floor_bytes(t: int, distinct: int, rank: int) -> tuple[int, int]:
    """(two-step, fused) bytes: adapters once, x once, h written; y 3 times (two-step) or once (fused)."""
    adapters = distinct * rank * (2 * IN_F + 2 * I) * 2
    x, y, h = t * IN_F * 2, t * 2 * I * 2, t * I * 2
    return adapters + x + 3 * y + h, adapters + x + y + h


def candidates(t: int) -> list[SiluBlocks]:
    table = silu_blocks(t)
    bm = table.bm
    extra = [SiluBlocks(bm, 64), SiluBlocks(bm, 128), SiluBlocks(bm, 256), SiluBlocks(bm, 128, 8)]
    if bm == 64:
        extra += [SiluBlocks(64, 64, 8), SiluBlocks(32, 128), SiluBlocks(64, 32)]
    return [table] + [c for c in dict.fromkeys(extra) if c != table]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="1,1;16,8;64,64;256,16;256,64;1024,64;4096,64;8192,64")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(module="gate_up", rank=args.rank, rows=[])
    pools = Pools(4, 64, args.rank)
    pools.set_rank(args.rank)
    for point in args.points.split(";"):
        t, a = (int(v) for v in point.split(","))
        f2, f1 = (b / bw * 1e6 for b in floor_bytes(t, min(t, a), args.rank))
        k = rotations_for(floor_bytes(t, min(t, a), args.rank)[0], l2)
        case = Case(pools, t, a, args.rank, k)

        def inputs(i):
            r = case.rot[i]
            return r["y"]["gate_up"], r["x"]["gate_up"], pools.w["gate_up"][r["copy"]], r["meta"]

        def two_step(i):
            y, x, w, meta = inputs(i)
            add_lora(y, x, w, meta)
            norm_rope.silu_mul(y)

        def fused(blocks):
            return lambda i: add_lora_silu_mul_triton(*inputs(i), silu=blocks)

        y, x, w, meta = inputs(0)
        y2 = y.clone()
        add_lora(y2, x, w, meta)
        same = torch.equal(add_lora_silu_mul(y.clone(), x, w, meta), norm_rope.silu_mul(y2))
        arms = {"two-step": two_step, "silu only": lambda i: norm_rope.silu_mul(inputs(i)[0])}
        arms.update({f"fused {c.bm}x{c.bn}w{c.num_warps}": fused(c) for c in candidates(t)})
        times = {name: [] for name in arms}
        for _ in range(args.repeats):
            for name, fn in arms.items():
                times[name].append(graph_time_us(fn, k))
        best = min((n for n in arms if n.startswith("fused")), key=lambda n: min(times[n]))
        table = f"fused {silu_blocks(t).bm}x{silu_blocks(t).bn}w{silu_blocks(t).num_warps}"
        row = dict(
            tokens=t,
            adapters=a,
            rank=args.rank,
            bit_identical=same,
            floor_two_step_us=round(f2, 2),
            floor_fused_us=round(f1, 2),
            best_fused=best,
            table_fused=table,
            **{f"{n}_us": round(min(v), 2) for n, v in times.items()},
        )
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
    report["elapsed_s"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(
        f"{'point':>10} {'two-step':>9} {'table':>9} {'best':>9} {'best blocks':>22} {'silu':>7} {'floor2':>7} "
        f"{'floor1':>7} same"
    )
    for r in report["rows"]:
        print(
            f"{r['tokens']:>5}/{r['adapters']:<4} {r['two-step_us']:>9.1f} {r[r['table_fused'] + '_us']:>9.1f} "
            f"{r[r['best_fused'] + '_us']:>9.1f} {r['best_fused']:>22} {r['silu only_us']:>7.1f} "
            f"{r['floor_two_step_us']:>7.1f} {r['floor_fused_us']:>7.1f} {r['bit_identical']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
