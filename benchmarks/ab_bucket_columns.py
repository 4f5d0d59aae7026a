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

import sys

from ab_pool import compare, parser
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


def main() -> int:
    args = parser(__doc__.splitlines()[0], ",".join(n for n in POLICIES if n != "current")).parse_args()
    compare({name: installer(POLICIES[name]) for name in args.arms.split(",")}, args)
    installer(CURRENT)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
