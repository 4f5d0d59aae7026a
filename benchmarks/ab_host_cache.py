"""A/B of the host cache sized to the page-locked arena (engine/pinned.host_cache_capacity) against the cache as
asked (`max_cpu_loras`), end to end in the engine.

    python3 benchmarks/ab_host_cache.py --rows 256/256,256/64 --repeats 1 --out $OUT/ab-host-cache.json

bench_e2e rows in ONE process, arms interleaved per row (multilora_cli/bench/ab.run_arms). The benchmark sizes
the host cache for the timed adapters plus the warm-up's (`max_cpu_loras` = adapters + slots), so with many
slots the arena (capped at a quarter of host memory) cannot hold it. "asked": the cache keeps `max_cpu_loras`
adapters and loads past the arena's end are packed in pageable memory; "arena": the cache gives way to the
arena. Run a throwaway process first (Triton cache), as for bench_e2e.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from multilora_cli.bench.ab import parser, run_arms  # noqa: E402
from multilora_cli.engine import engine as engine_mod  # noqa: E402

SIZED = engine_mod.host_cache_capacity


def main() -> int:
    p = parser(__doc__.splitlines()[0], "256/256,256/64")
    args = p.parse_args()

    def arm(sized: bool):
        def switch():
            engine_mod.host_cache_capacity = SIZED if sized else (lambda arena, size, cpu, slots: cpu)

        return switch

    def extra(e: dict) -> dict:
        arena = e.get("pinned_arena") or {}
        return {
            "steps": e["steps"],
            "decode_steps": e["decode_steps"],
            "fallbacks": arena.get("fallbacks"),
            "host_outside_steps_s": round(e["host_outside_steps_s"], 3),
            "mean_adapters_per_decode_step": round(e["mean_adapters_per_decode_step"], 1),
        }

    try:
        run_arms(args, {"asked": arm(False), "arena": arm(True)}, extra, command=" ".join(sys.argv))
    finally:
        engine_mod.host_cache_capacity = SIZED
    return 0


if __name__ == "__main__":
    sys.exit(main())
