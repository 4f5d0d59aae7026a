"""A/B of the slot pool's B layout for the expand: rank-major (the pool's storage: rank row j of a slot is one run
over out) against out-major ([L, out, R] contiguous: a CTA's [BN columns x R] block is one contiguous run).

    PYTHONPATH=. python3 benchmarks/ab_b_layout.py --out $OUT/ab-b-layout.json

Rank-major makes a rank-16 adapter in a rank-64 pool read exactly its bytes, but a 256-column expand CTA then
reads 16 runs of 512 bytes, one per rank row, 8 KiB apart per 4,096 columns. In a tight pool (max_rank = the
adapters' rank, as the engine sizes it) out-major reads the same bytes as one run. The kernels take B's strides,
so both arms run the same code; outputs must be bit-identical. Driver: ab_pool.py (arms swap every pool copy's
b for a same-valued tensor in the other layout).
"""

from __future__ import annotations

import sys

from ab_pool import compare, parser
from bench_kernels import Pools

_POOLS: list[Pools] = []
_SAVED: dict = {}


def installer(out_major: bool):
    def install():
        for pools in _POOLS:
            for n, ws in pools.w.items():
                for i, w in enumerate(ws):
                    key = (id(pools), n, i)
                    if key not in _SAVED:
                        _SAVED[key] = (w.b, w.b.contiguous())  # (rank-major view, out-major copy)
                    w.b = _SAVED[key][1] if out_major else _SAVED[key][0]

    return install


class TrackedPools(Pools):
    """Pools that the arms can reach (ab_pool builds its own)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        _POOLS.append(self)


def main() -> int:
    import ab_pool

    ab_pool.Pools = TrackedPools
    args = parser(__doc__.splitlines()[0], "rank-major,out-major").parse_args()
    compare({name: installer(name == "out-major") for name in args.arms.split(",")}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
