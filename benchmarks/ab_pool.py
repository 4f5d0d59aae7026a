"""Shared driver of the kernel A/Bs over rank mixes (ab_bucket_columns.py; ab_shrink_passes.py at 82df1fe and
ab_split_inner.py at d4500af, the commits where their knobs existed): arms are functions that install a variant of
the kernels; every arm runs on the same pools, cases and rotations.

In a slot pool of --pool-rank (64 by default), per point and rank mix (rank 16, rank 64, or slots alternating
16 / 64 = "mixed"): the layer as bench_kernels.py times it (add_lora on qkv, o, gate_up, down) and the engine's
gate_up (shrink + fused SiLU expand); optionally module by module. Timing and the bit-for-bit check:
ab_kernels.time_arms (bench_kernels.py's timing, arms interleaved per point and repeated, min taken). The floor
interpolates the bytes linearly in the mean rank (adapter bytes are linear in it).
"""

from __future__ import annotations

import argparse
import json
import time

from ab_kernels import time_arms
from bench_kernels import Case, Pools, device_report, floor_bytes, module_times, rotations_for, save_report


def set_ranks(pools: Pools, kind: str) -> float:
    """Every slot's rank: 16, 64 or alternating ('mixed'); returns the mean rank."""
    for ws in pools.w.values():
        for w in ws:
            w.scale.fill_(2.0)
            if kind == "mixed":
                w.rank[0::2] = 16
                w.rank[1::2] = 64
            else:
                w.rank.fill_(int(kind))
    return 40.0 if kind == "mixed" else float(kind)


def parser(description: str, arms: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--points", default="1,1;16,8;64,64;256,16;256,64;1024,64;4096,64", help="tokens,adapters;...")
    p.add_argument("--module-points", default="", help="tokens,adapters;... also timed module by module")
    p.add_argument("--ranks", default="16,64,mixed")
    p.add_argument("--arms", default=arms)
    p.add_argument("--pool-rank", type=int, default=64, help="max_rank of the slot pool")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    return p


def compare(arms: dict, args) -> dict:
    """Run every point x rank mix under each arm (name -> install function); returns the saved report."""
    start = time.time()
    l2, bw, report = device_report(rows=[], modules=[], pool_rank=args.pool_rank)
    pools = Pools(4, 64, args.pool_rank)
    for kind in args.ranks.split(","):
        mean_rank = set_ranks(pools, kind)
        for point in args.points.split(";"):
            t, a = (int(v) for v in point.split(","))
            lo, hi = floor_bytes(t, min(t, a), 16), floor_bytes(t, min(t, a), 64)
            fb = round(lo + (hi - lo) * (mean_rank - 16) / 48)
            k = rotations_for(fb, l2)
            case = Case(pools, t, a, 16, k)
            same, best = time_arms(case, pools, arms, k, args.repeats)
            row = dict(tokens=t, adapters=a, ranks=kind, floor_us=round(fb / bw * 1e6, 2), bit_identical=same, **best)
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            del case
            if point in args.module_points.split(";"):
                for m in module_times(pools, t, a, 16, l2, arms):
                    m.update(tokens=t, adapters=a, ranks=kind)
                    report["modules"].append(m)
            save_report(report, args.out, start)
    return report
