"""A/B of the shrink's partial-sum layout (`sgmv_shrink.SPLIT_INNER`): each K-split partial contiguous, or the
split innermost so that an expand CTA loads all of a row's partials as one vector.

    PYTHONPATH=. python3 benchmarks/ab_split_inner.py --pool-rank 16 --ranks 16 --out $OUT/ab-split-inner.json

At decode sizes every expand grid fits in one wave, so an expand's time is about one CTA's chain after the
shrink: 8-16 dependent L2 round trips for the partials, then the dot and the store. Sessions 5 and 6 loaded
the partials at once from the [split, T, n_slices, R] layout and lost (the [SPLIT, BM, RB] load and the
cross-thread sum over SPLIT cost more registers and barriers than the round trips); with the split innermost
the partials of one (row, rank) are adjacent, so the load vectorises along the split and the sum stays in a
thread. Arms: "outer" (the layout before) and "inner". Driver: ab_pool.py.

Rejected (results/ab-split-inner-h200-run1.json, tight pool; -pool64.json, rank-64 pool): slower at the target
(256 tokens / 64 adapters, layer 88.7 -> 92.4 us; every module 0.6-1.4 us slower) and wherever it matters
(256 / 16: 51.6 -> 54.6; 1,024 tokens +6%; rank-64 pool, 256 / 16 mixed 91.5 -> 134.2); faster only at 64 / 64
(112.4 -> 111.5) and 1 token (17.9 -> 17.6). The knob was removed; this script runs at commit d4500af.
"""

from __future__ import annotations

import sys

from ab_pool import compare, parser
from multilora_cli.kernels import sgmv_shrink

CURRENT = sgmv_shrink.SPLIT_INNER


def installer(inner: bool):
    def install():
        sgmv_shrink.SPLIT_INNER = inner
    return install


def main() -> int:
    args = parser(__doc__.splitlines()[0], "outer,inner").parse_args()
    compare({name: installer(name == "inner") for name in args.arms.split(",")}, args)
    installer(CURRENT)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
