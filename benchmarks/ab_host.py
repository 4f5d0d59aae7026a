"""A/B of host-side knobs of the engine on the end-to-end benchmark: GIL switch interval, prefetch threads,
device staging buffers, the page-locked host arena.

    PYTHONPATH=. python3 benchmarks/ab_host.py --switch-ms 0.5 --prefetch-threads 2 -- --rows base,64 --out X.json

Everything after `--` goes to bench_e2e.py unchanged; the knobs are set in this process before it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch-ms", type=float, default=None, help="sys.setswitchinterval, milliseconds")
    ap.add_argument("--prefetch-threads", type=int, default=None)
    ap.add_argument("--staging-buffers", type=int, default=None, help="device staging buffers (engine/staging.py)")
    ap.add_argument("--no-arena", action="store_true", help="pack adapters into pageable memory (no PinnedArena)")
    ap.add_argument("--no-scatter", action="store_true", help="slot loads by foreach copies, not the Triton scatter")
    args = ap.parse_args(own)
    if args.no_scatter:
        import multilora_cli.engine.slot_writer as slot_writer

        slot_writer.SCATTER_KERNEL = False
    if args.no_arena:
        import multilora_cli.engine.engine as engine

        engine.Engine._make_arena = lambda self: (None, self.config.max_cpu_loras)
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1000)
    if args.prefetch_threads is not None:
        import multilora_cli.engine.engine as engine

        engine.PREFETCH_THREADS = args.prefetch_threads
    if args.staging_buffers is not None:
        import multilora_cli.engine.runner as runner

        runner.STAGING_BUFFERS = args.staging_buffers
    import bench_e2e

    return bench_e2e.main(
        rest
        + [
            "--note",
            f"ab_host switch_ms={args.switch_ms} prefetch_threads="
            f"{args.prefetch_threads} staging_buffers={args.staging_buffers} "
            f"arena={not args.no_arena} scatter={not args.no_scatter}",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
