"""A/B of how the shrink walks ranks above 16 in a rank-64 slot pool (`sgmv_shrink.PASS_RANK_ROWS`).

    PYTHONPATH=. python3 benchmarks/ab_shrink_passes.py --out $OUT/ab-shrink-passes.json

A kernel is allocated registers for its largest branch: the rank-64 bucket's [BM, slices x 64] accumulator
raised the qkv shrink from 94 to 140 registers per thread in a rank-64 pool (results/probe-pool-rank-h200.json),
and rank-16 adapters there ran 16.1 us instead of 14.0 (256 tokens / 64 adapters). Arms: "pass64" = one pass of
the smallest bucket holding the rank (32 or 64; the kernel before), "pass32" / "pass16" = passes of 32 / 16 rank
rows, each over the CTA's whole K range (A bytes unchanged; x re-read from L2 per pass). Driver: ab_pool.py.

Rejected (results/ab-shrink-passes-h200-run1.json): passes of 32 gain at 256 tokens / 64 adapters (-2% rank 16,
-11% rank 64, -4% mixed) but lose at 256 / 16 (+3.5-4%), 1-64 tokens (up to +6%) and 4,096 tokens (+24%), and a
graph's kernels cannot know the step's adapter count. The knob was removed from sgmv_shrink.py; this script
runs at commit 82df1fe, where it exists.
"""

from __future__ import annotations

import sys

from ab_pool import compare, parser
from multilora_cli.kernels import sgmv_shrink

CURRENT = sgmv_shrink.PASS_RANK_ROWS


def installer(rows: int):
    def install():
        sgmv_shrink.PASS_RANK_ROWS = rows
    return install


def main() -> int:
    args = parser(__doc__.splitlines()[0], "pass64,pass32,pass16").parse_args()
    compare({name: installer(int(name[4:])) for name in args.arms.split(",")}, args)
    installer(CURRENT)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
