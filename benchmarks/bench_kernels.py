"""Benchmark the SGMV kernels on one Llama-3-8B layer (qkv, o, gate_up, down) against a torch per-adapter
loop and the HBM floor.

    python -m benchmarks.bench_kernels --out benchmarks/results/kernels-<device>.json
    python -m benchmarks.bench_kernels --render benchmarks/results/kernels-h200.json    # the grid as markdown

Every timing is the median of CUDA-graph replays (triton.testing.do_bench, which also clears L2 between
replays); each graph runs K rotations of the layer over different weight-pool copies, slots, x and y, so
that one rotation's bytes are not in L2 for the next. The floor is the bytes that must move (each distinct
adapter's A and B for the rank used, x once, y read and written once) over the device-to-device copy
bandwidth measured in the same run. Needs CUDA; imports no CLI dependency.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch
import triton

from benchmarks.sgmv_cases import DEVICE, MODULES, Case, Pools, floor_bytes, rotations_for
from benchmarks.timing import (
    command_line,
    copy_bandwidth,
    eager_time_us,
    graph_time_us,
    ints,
    parser,
    save_report,
)
from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks, expand_blocks, shrink_blocks
from multilora_cli.kernels.sgmv_expand import lora_expand
from multilora_cli.kernels.sgmv_shrink import lora_shrink


def run_grid(args, pools: Pools, bw: float, l2: int, results: list, deadline: float) -> None:
    for rank in ints(args.ranks):
        pools.set_rank(rank)
        for t in ints(args.tokens):
            for adapters in ints(args.adapters):
                if time.time() > deadline:
                    print("grid: deadline reached, stopping", flush=True)
                    return
                distinct = min(t, adapters)
                if any(r["tokens"] == t and r["distinct"] == distinct and r["rank"] == rank for r in results):
                    continue  # more adapters than tokens: the same point as one already measured
                fb = floor_bytes(t, distinct, rank)
                k = rotations_for(fb, l2)
                case = Case(pools, t, adapters, rank, k)
                ours = graph_time_us(case.ours, k)
                kernels_per_rot = 1 + distinct * 30
                kt = max(1, min(k, 3000 // kernels_per_rot))
                loop = graph_time_us(case.torch_loop, kt)
                ours_eager = eager_time_us(case.ours, min(k, 4))
                floor_us = fb / bw * 1e6
                row = dict(
                    tokens=t,
                    adapters=adapters,
                    distinct=distinct,
                    rank=rank,
                    pool_rank=pools.pool_rank,
                    rotations=k,
                    floor_bytes=fb,
                    floor_us=round(floor_us, 2),
                    ours_us=round(ours, 2),
                    ours_eager_us=round(ours_eager, 2),
                    torch_loop_us=round(loop, 2),
                    ours_over_floor=round(ours / floor_us, 3),
                    torch_over_ours=round(loop / ours, 2),
                )
                results.append(row)
                print(json.dumps(row), flush=True)
                del case


def run_modules(pools: Pools, bw: float, l2: int, t: int, adapters: int, rank: int) -> dict:
    """Per-module times at one point, to see where the time goes."""
    pools.set_rank(rank)
    out = {}
    distinct = min(t, adapters)
    for n in MODULES:
        k = rotations_for(floor_bytes(t, distinct, rank) // 4, l2)
        case = Case(pools, t, adapters, rank, k)
        us = graph_time_us(lambda i, case=case, n=n: case.ours(i, modules=[n]), k)
        in_f, slices = MODULES[n]
        fb = distinct * rank * (len(slices) * in_f + sum(slices)) * 2 + t * in_f * 2 + t * sum(slices) * 4
        out[n] = dict(
            ours_us=round(us, 2),
            floor_us=round(fb / bw * 1e6, 2),
            shrink=str(shrink_blocks(t, in_f, len(slices), pools.pool_rank, 132)),
            expand=str(expand_blocks(t, sum(slices), len(slices), pools.pool_rank, 132)),
        )
        del case
    return out


def sweep(
    pools: Pools,
    l2: int,
    points: list[tuple[int, int, int]],
    deadline: float,
    kinds: tuple[str, ...] = ("shrink", "expand"),
) -> list:
    """Time shrink and expand alone per module for a few block-size candidates around the table's choice."""
    rows = []
    for t, adapters, rank in points:
        pools.set_rank(rank)
        distinct = min(t, adapters)
        for n, (in_f, slices) in MODULES.items():
            k = rotations_for(floor_bytes(t, distinct, rank) // 4, l2)
            case = Case(pools, t, adapters, rank, k)
            base_s = shrink_blocks(t, in_f, len(slices), pools.pool_rank, 132)
            base_e = expand_blocks(t, sum(slices), len(slices), pools.pool_rank, 132)
            s_cands = {base_s}
            for split in (1, 2, 4, 8, 16, 32):
                s_cands.add(ShrinkBlocks(base_s.bm, base_s.bk, split, base_s.num_warps, base_s.num_stages))
            for bk, st in ((64, 4), (128, 3), (256, 2)):
                s_cands.add(ShrinkBlocks(base_s.bm, bk, base_s.split, base_s.num_warps, st))
            s_cands.add(
                ShrinkBlocks(base_s.bm, base_s.bk, base_s.split, 8 if base_s.num_warps == 4 else 4, base_s.num_stages)
            )
            for warps, stages in ((2, base_s.num_stages), (4, 2), (4, 5), (2, 5)):  # fewer warps, deeper pipes
                s_cands.add(ShrinkBlocks(base_s.bm, base_s.bk, base_s.split, warps, stages))
            e_cands = {base_e}
            for bn, nb in ((64, 1), (128, 1), (128, 2), (128, 4), (128, 8), (256, 1), (256, 2), (256, 4), (512, 1)):
                e_cands.add(ExpandBlocks(base_e.bm, bn, nb, base_e.num_warps, 3 if nb >= 3 else 2))
            e_cands.add(
                ExpandBlocks(base_e.bm, base_e.bn, base_e.nb, 8 if base_e.num_warps == 4 else 4, base_e.num_stages)
            )
            # no cp.async pipeline (num_stages 1: no shared-memory staging barriers) and fewer warps
            for bn, nb in ((128, 1), (128, 4), (256, 1), (256, 2)):
                for warps, stages in ((4, 1), (2, 1), (2, 2)):
                    e_cands.add(ExpandBlocks(base_e.bm, bn, nb, warps, stages))
            for kind, cands in (("shrink", s_cands), ("expand", e_cands)):
                if kind not in kinds:
                    continue
                for c in sorted(cands, key=str):
                    if time.time() > deadline:
                        print("sweep: deadline reached", flush=True)
                        return rows
                    if kind == "shrink" and (in_f // c.bk) % c.split:
                        continue

                    # the partials the table's shrink writes at this shape (an expand sums all of them), random:
                    # a single zero partial hides the partial-sum cost and can run faster than real data
                    case_s = [
                        torch.randn((base_s.split, t, len(slices), pools.pool_rank), device=DEVICE) for _ in range(k)
                    ]

                    def fn(i, c=c, kind=kind, case=case, case_s=case_s, n=n, t=t):
                        r = case.rot[i]
                        w = pools.w[n][r["copy"]]
                        if kind == "shrink":
                            s = torch.empty((c.split, t, w.n_slices, w.max_rank), device=DEVICE, dtype=torch.float32)
                            lora_shrink(r["x"][n], w, r["meta"], s, c)
                        else:
                            lora_expand(case_s[i], w, r["meta"], r["y"][n], c)

                    try:
                        us = graph_time_us(fn, k, rep_ms=30)
                    except Exception as e:  # noqa: BLE001 - a candidate that does not compile (shared memory) is skipped
                        print(f"sweep {kind} {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                        continue
                    row = dict(
                        tokens=t,
                        adapters=adapters,
                        rank=rank,
                        module=n,
                        kernel=kind,
                        blocks=str(c),
                        table=str(base_s if kind == "shrink" else base_e) == str(c),
                        us=round(us, 2),
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del case
    return rows


def render_markdown(report: dict) -> str:
    """The grid of a results json as a markdown table (no figure typed by hand)."""
    lines = [
        f"Device: {report['device']} ({report['sms']} SMs, L2 {report['l2_bytes'] >> 20} MiB), measured copy "
        f"bandwidth {report['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; torch {report['torch']}, triton "
        f"{report['triton']}; bf16, pool max_loras={report['max_loras']} max_rank={report['pool_rank']}.",
        "",
        "| tokens | distinct adapters | rank | ours us | floor us | ours/floor | torch loop us | torch/ours "
        "| ours eager us |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["grid"]:
        lines.append(
            f"| {r['tokens']} | {r['distinct']} | {r['rank']} | {r['ours_us']:.1f} | {r['floor_us']:.1f} | "
            f"{r['ours_over_floor']:.2f} | {r['torch_loop_us']:.1f} | {r['torch_over_ours']:.1f} | "
            f"{r['ours_eager_us']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        with open(sys.argv[2]) as f:
            print(render_markdown(json.load(f)))
        return 0
    p = parser(__doc__)
    p.add_argument("--tokens", default="1,16,64,256,1024,4096")
    p.add_argument("--adapters", default="1,8,64")
    p.add_argument("--ranks", default="8,16,64")
    p.add_argument("--pool-rank", type=int, default=64, help="max_rank of the slot pool (ranks below it are masked)")
    p.add_argument("--max-loras", type=int, default=64)
    p.add_argument("--copies", type=int, default=4, help="weight-pool copies rotated through")
    p.add_argument("--target", default="256,64,16", help="tokens,adapters,rank of the target point")
    p.add_argument("--sweep", default="", help="block-size sweep points 't,a,r;t,a,r' (empty: none)")
    p.add_argument("--sweep-kinds", default="shrink,expand", help="which kernels the sweep times")
    p.add_argument("--budget-s", type=float, default=240, help="stop starting new work after this many seconds")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA device", file=sys.stderr)
        return 2
    start = time.time()
    deadline = start + args.budget_s
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    bw = copy_bandwidth()
    print(
        f"{props.name}: {props.multi_processor_count} SMs, L2 {l2 >> 20} MiB, copy bandwidth {bw / 1e12:.2f} TB/s",
        flush=True,
    )
    report = dict(
        device=props.name,
        sms=props.multi_processor_count,
        l2_bytes=l2,
        copy_bandwidth_Bps=round(bw),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        command=command_line("benchmarks.bench_kernels"),
        dtype="bfloat16",
        shapes={n: dict(in_features=i, slices=s) for n, (i, s) in MODULES.items()},
        max_loras=args.max_loras,
        pool_rank=args.pool_rank,
        copies=args.copies,
        timing="median of CUDA-graph replays (triton do_bench, L2 cleared between replays) / rotations",
        floor="bytes(each distinct adapter's A,B at its rank once + x once + y read and written) / copy bw",
        grid=[],
        target={},
        modules={},
        sweep=[],
    )

    def save():
        save_report(report, args.out, start)

    pools = Pools(args.copies, args.max_loras, args.pool_rank)
    t, a, r = ints(args.target)
    report["modules"] = run_modules(pools, bw, l2, t, a, r)
    print(json.dumps(report["modules"]), flush=True)
    save()
    run_grid(args, pools, bw, l2, report["grid"], deadline)
    save()
    # the target point again with a tight pool (max_rank == rank), as an engine sizing max_lora_rank would run it
    if args.pool_rank != r and time.time() < deadline:
        tight = Pools(args.copies, args.max_loras, r)
        rows = []
        run_grid(argparse.Namespace(ranks=str(r), tokens=str(t), adapters=str(a)), tight, bw, l2, rows, deadline)
        report["target_tight_pool"] = rows
        report["modules_tight_pool"] = run_modules(tight, bw, l2, t, a, r)
        save()
        del tight
    if args.sweep:
        pts = [tuple(ints(s)) for s in args.sweep.split(";") if s]
        report["sweep"] = sweep(pools, l2, pts, deadline, tuple(args.sweep_kinds.split(",")))
    save()
    for row in report["grid"]:
        if (row["tokens"], row["adapters"], row["rank"]) == (t, a, r):
            report["target"] = row
    save()
    print(f"done in {time.time() - start:.0f}s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
