"""End-to-end A/B of the 16-128-token gate_up shrink split cap (`blocks.shrink_blocks`, session 16): decode steps
of 64 sequences over 64 adapters, where every step has ~one row per adapter.

    python3 benchmarks/ab_small_blocks_e2e.py --rows 64 --max-num-seqs 64 --requests 512 --out $OUT/ab.json

bench_e2e rows (Llama-3-8B shapes, random weights, N x (128 + 128), greedy) in ONE process, arms interleaved per
row and repeated: "before" = gate_up's shrink split as the formula gives it (16 at 16-128 tokens), "now" = the
table. Everything else is shared. Run a throwaway process first (Triton cache). Kernel-level numbers:
benchmarks/ab_small_blocks.py.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from multilora_cli.bench.ab import parser, run_arms  # noqa: E402
from multilora_cli.kernels import blocks, sgmv_shrink  # noqa: E402

CURRENT = blocks.shrink_blocks


def uncapped(t, in_f, n_slices, max_rank, num_sms=132):
    b = CURRENT(t, in_f, n_slices, max_rank, num_sms)
    return replace(b, split=CURRENT(t, in_f, 1, max_rank, num_sms).split) if n_slices == 2 else b


def main() -> int:
    args = parser(__doc__.splitlines()[0], "64").parse_args()

    def arm(table):
        def switch():
            sgmv_shrink.shrink_blocks = table

        return switch

    try:
        run_arms(args, {"before": arm(uncapped), "now": arm(CURRENT)}, command=" ".join(sys.argv))
    finally:
        sgmv_shrink.shrink_blocks = CURRENT
    return 0


if __name__ == "__main__":
    sys.exit(main())
