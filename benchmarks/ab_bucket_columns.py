"""A/B of how many columns the fused SiLU expand's rank-32 / rank-64 buckets take per step
(`blocks.silu_bucket_columns`), in a rank-64 slot pool.

    PYTHONPATH=. python3 benchmarks/ab_bucket_columns.py --out $OUT/ab-bucket-columns.json

A kernel's registers and shared memory are those of its largest branch, so in a rank-64 slot pool the rank-64
bucket's B tiles lower the occupancy of every CTA, rank-16 ones included. Taking fewer columns per step in the
larger buckets bounds that, at the price of more steps (after the PDL wait) for the large ranks. Arms are
policies (bn, rank bucket, tokens) -> columns per step installed into the SiLU expand; everything else is shared.
Per point: the layer as bench_kernels.py times it (its gate_up uses the plain expand, so the layer column is a
control) and the engine's gate_up (shrink + fused SiLU expand), for rank-16, rank-64 and mixed (slots alternating
16 / 64) adapters. Same timing as bench_kernels.py (median of CUDA-graph replays of K rotations, L2 cleared
between replays); arms interleaved per point and repeated, min taken; outputs compared bit for bit with the first.

Runs 1-2 (results/ab-bucket-columns-h200-run{1,2}.json) were made at commits ba85539 / c8c0632, when the plain
expand had the same knob (arms there: a policy per kernel, "nbX" = the expand's). It was removed: no policy won
for the plain expand with rank-64 and mixed adapters."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ab_kernels import outputs, silu_fn
from bench_kernels import (Case, Pools, device_report, floor_bytes, graph_time_us, module_times, rotations_for,
                           save_report)
from multilora_cli.kernels import sgmv_silu


CURRENT = sgmv_silu.silu_bucket_columns


def none(bn, rb, t):
    return bn


def p16(bn, rb, t):  # B tiles of the rank-16 bucket's size
    return max(16, bn * 16 // rb)


def p32(bn, rb, t):  # twice that
    return max(16, min(bn, bn * 32 // rb))


def from_64(policy):
    return lambda bn, rb, t: policy(bn, rb, t) if 64 <= t <= 256 else bn


POLICIES = {"none": none, "current": CURRENT, "p16": from_64(p16), "p32": from_64(p32)}


def installer(policy):
    def install():
        sgmv_silu.silu_bucket_columns = policy
    return install


def set_ranks(pools: Pools, kind: str) -> float:
    """Every slot's rank: 16, 64 or alternating ('mixed'); returns the mean rank (the floor is linear in it)."""
    for ws in pools.w.values():
        for w in ws:
            w.scale.fill_(2.0)
            if kind == "mixed":
                w.rank[0::2] = 16
                w.rank[1::2] = 64
            else:
                w.rank.fill_(int(kind))
    return 40.0 if kind == "mixed" else float(kind)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="1,1;16,8;64,64;256,16;256,64;1024,64;4096,64", help="tokens,adapters;...")
    p.add_argument("--module-points", default="", help="tokens,adapters;... also timed module by module")
    p.add_argument("--ranks", default="16,64,mixed")
    p.add_argument("--arms", default=",".join(n for n in POLICIES if n != "current"))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(rows=[], modules=[], pool_rank=64)
    arms = {name: installer(POLICIES[name]) for name in args.arms.split(",")}
    pools = Pools(4, 64, 64)
    for kind in args.ranks.split(","):
        mean_rank = set_ranks(pools, kind)
        for point in args.points.split(";"):
            t, a = (int(v) for v in point.split(","))
            lo, hi = floor_bytes(t, min(t, a), 16), floor_bytes(t, min(t, a), 64)
            fb = round(lo + (hi - lo) * (mean_rank - 16) / 48)  # adapter bytes are linear in the rank
            k = rotations_for(fb, l2)
            case = Case(pools, t, a, 16, k)
            ys = {name: outputs(case, pools, install) for name, install in arms.items()}
            ref = ys[next(iter(arms))]
            same = {name: all(torch.equal(u, v) for u, v in zip(ref, y)) for name, y in ys.items()}
            times = {f"{name} {what}": [] for name in arms for what in ("layer", "silu")}
            for _ in range(args.repeats):
                for name, install in arms.items():
                    install()
                    times[f"{name} layer"].append(graph_time_us(case.ours, k))
                    times[f"{name} silu"].append(graph_time_us(silu_fn(case, pools), k))
            best = {key: round(min(v), 2) for key, v in times.items()}
            row = dict(tokens=t, adapters=a, ranks=kind, floor_us=round(fb / bw * 1e6, 2), bit_identical=same, **best)
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            del case
            if point in args.module_points.split(";"):
                for m in module_times(pools, t, a, 16, l2, arms):
                    m.update(tokens=t, adapters=a, ranks=kind)
                    report["modules"].append(m)
            save_report(report, args.out, start)
    installer(CURRENT)()
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
