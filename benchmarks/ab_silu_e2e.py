"""A/B of the fused SiLU expand's column steps (`blocks.silu_bucket_columns`) end to end: adapters of rank 64, so
the slot pool compiles the rank-64 branch the steps are for.

    python3 benchmarks/ab_silu_e2e.py --rows 64 --rank 64 --repeats 2 --out $OUT/ab-silu-e2e.json

bench_e2e rows (Llama-3-8B shapes, random weights, 1024 x (128 + 128), greedy, run-ahead on) in ONE process, arms
interleaved per row and repeated: "before" = every bucket takes its CTA's whole column block (the kernel before
session 12), "steps" = the current table. Everything else is shared. Run a throwaway process first (Triton cache).
Kernel-level numbers: benchmarks/ab_bucket_columns.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from multilora_cli.bench.ab import parser, run_arms  # noqa: E402
from multilora_cli.kernels import sgmv_silu  # noqa: E402

CURRENT = sgmv_silu.silu_bucket_columns


def main() -> int:
    p = parser(__doc__.splitlines()[0], "64", rank=64)
    args = p.parse_args()

    def arm(policy):
        def switch():
            sgmv_silu.silu_bucket_columns = policy

        return switch

    try:
        run_arms(args, {"before": arm(lambda bn, rb, t: bn), "steps": arm(CURRENT)}, command=" ".join(sys.argv))
    finally:
        sgmv_silu.silu_bucket_columns = CURRENT
    return 0


if __name__ == "__main__":
    sys.exit(main())
