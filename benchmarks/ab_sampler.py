"""A/B of the sort-free sampling kernel (kernels/sample.py) against the same sampling definition in torch ops
(a [B, V] sort per step), end to end in the engine.

    python3 benchmarks/ab_sampler.py --rows base,64 --repeats 2 --out $OUT/ab-sampler.json

bench_e2e rows (Llama-3-8B shapes, random weights, 1024 x (128 + 128), seeded sampling at --temperature and
--top-p, ignore_eos, run-ahead on) in ONE process, the two arms interleaved per row and repeated:
"torch" runs `Sampler`'s torch path on the GPU logits, "triton" its kernel; the LoRA and attention kernels are
the same in both. Per row: tok/s, the median decode step at the common batch size, decode and prefill seconds.
Run a throwaway process first (Triton cache), as for bench_e2e.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from multilora_cli.bench.ab import parser, run_arms  # noqa: E402
from multilora_cli.engine import sampler as sampler_mod  # noqa: E402
from multilora_cli.kernels import use_triton  # noqa: E402


def main() -> int:
    p = parser(__doc__.splitlines()[0], "base,64", temperature=1.0, top_p=0.9)
    args = p.parse_args()
    if args.temperature <= 0:
        p.error("--temperature must be > 0: greedy rows do not sample")

    def arm(triton: bool):
        def switch():  # the sampler module's own name: the LoRA layers keep theirs (Triton on CUDA) in both arms
            sampler_mod.use_triton = use_triton if triton else (lambda t: False)

        return switch

    try:
        run_arms(args, {"torch": arm(False), "triton": arm(True)}, command=" ".join(sys.argv))
    finally:
        sampler_mod.use_triton = use_triton
    return 0


if __name__ == "__main__":
    sys.exit(main())
