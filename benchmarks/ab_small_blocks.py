"""A/B of the 16-64-token block table for many adapters per step: fewer shrink partials, more columns per expand.

    PYTHONPATH=. python3 benchmarks/ab_small_blocks.py --pool-rank 16 --ranks 16 --out $OUT/ab-small-blocks.json

The table plans 16-64-token steps for one adapter (T / 16 tiles): the shrink splits K 16 ways and each expand
CTA takes one 128-column block, so at 64 tokens / 64 adapters (64 one-row tiles) the gate_up expand runs 14,336
CTAs, each summing 16 partials (probe_chain_floor.py: 46.8 us against a 21.7 us streaming stand-in). Arms cap
the shrink's split at 16-64 tokens (the expand sums fewer partials; fewer, longer shrink CTAs) and / or give
wide expands (> 8192 columns) several column blocks per CTA. A graph's table cannot see the adapter count, so an
arm must not lose at 1-8 adapters. Arms change the K split, so the fp32 sum order: outputs may differ in the
last bits (bit_identical says so). Shared driver: ab_pool.py. Runs 1-2 were made before the table took
"split8gu" and "nb4" (16-64 tokens); run 3's "now" is the table with them.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from ab_pool import compare, parser
from multilora_cli.kernels import blocks, sgmv_expand, sgmv_shrink

SHRINK, EXPAND = blocks.shrink_blocks, blocks.expand_blocks


def shrink_cap(cap, slices=(1, 2, 3), hi=64):
    def table(t, in_f, n_slices, max_rank, num_sms=132):
        b = SHRINK(t, in_f, n_slices, max_rank, num_sms)
        return replace(b, split=min(b.split, cap)) if 16 <= t <= hi and n_slices in slices else b

    return table


def wide_nb(nb, hi=64):
    def table(t, out_f, n_slices, max_rank, num_sms=132):
        b = EXPAND(t, out_f, n_slices, max_rank, num_sms)
        return replace(b, nb=nb, num_stages=3 if nb >= 3 else 2) if 16 <= t <= hi and out_f > 8192 else b

    return table


def narrow_nb(nb):  # run 4: qkv, o, down (<= 8192 columns) at 17-64 tokens
    def table(t, out_f, n_slices, max_rank, num_sms=132):
        b = EXPAND(t, out_f, n_slices, max_rank, num_sms)
        return replace(b, nb=nb, num_stages=3 if nb >= 3 else 2) if 16 < t <= 64 and out_f <= 8192 else b

    return table


def uncapped(t, in_f, n_slices, max_rank, num_sms=132):  # run 5: the table before the two-slice cap
    b = SHRINK(t, in_f, n_slices, max_rank, num_sms)
    return replace(b, split=SHRINK(t, in_f, 1, max_rank, num_sms).split) if n_slices == 2 else b


ARMS = {
    "now": (SHRINK, EXPAND),
    "split8": (shrink_cap(8), EXPAND),
    "split4": (shrink_cap(4), EXPAND),
    "nb4": (SHRINK, wide_nb(4)),
    "split4+nb4": (shrink_cap(4), wide_nb(4)),
    "split8gu": (shrink_cap(8, (2,)), EXPAND),  # gate_up only (2 slices): the engine's fused SiLU path
    "split8gu+nb4": (shrink_cap(8, (2,)), wide_nb(4)),
    # run 3, after the table took split8gu and nb4 at 16-64 tokens: the same rules up to 128 tokens
    "split8gu128": (shrink_cap(8, (2,), 128), EXPAND),
    "nb4-128": (SHRINK, wide_nb(4, 128)),
    "split8gu128+nb4-128": (shrink_cap(8, (2,), 128), wide_nb(4, 128)),
    "narrow-nb2": (SHRINK, narrow_nb(2)),
    "narrow-nb4": (SHRINK, narrow_nb(4)),
    "uncapped": (uncapped, EXPAND),
}


def installer(pair):
    def install():
        sgmv_shrink.shrink_blocks, sgmv_expand.expand_blocks = pair

    return install


def main() -> int:
    p = parser(__doc__.splitlines()[0], ",".join(ARMS))
    p.set_defaults(points="16,1;16,16;64,1;64,8;64,16;64,64", ranks="16", pool_rank=16)
    args = p.parse_args()
    compare({name: installer(ARMS[name]) for name in args.arms.split(",")}, args)
    installer(ARMS["now"])()
    return 0


if __name__ == "__main__":
    sys.exit(main())
