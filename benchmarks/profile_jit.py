"""Which Triton launches are slow on the host (compile, or load from the on-disk cache), row by row of an e2e run?

    python -m benchmarks.profile_jit --rows 64,64,64 --requests 1024 [--slow-ms 2] [--detail]

Wraps `JITFunction.run` (every Triton launch) and reports launches whose host time exceeds --slow-ms, with the
kernel name and the row they fall in; also the caching allocator's segment allocations (cudaMalloc) per row.
Every other argument goes to benchmarks.bench_e2e. The question it answers: is a slow prefill in a process's
first rows Triton compiling (or loading) a kernel variant the first time a shape bucket appears, or device memory
being allocated? (Mid-run compiles were the cause once; the engine now precompiles: engine/precompile.py.)
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

from benchmarks import bench_e2e


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton.runtime.jit as jit

    argv = list(sys.argv[1:] if argv is None else argv)
    detail = "--detail" in argv  # also print each slow launch's scalar arguments and constexprs
    if detail:
        argv.remove("--detail")
    slow_ms = 2.0
    if "--slow-ms" in argv:
        i = argv.index("--slow-ms")
        slow_ms = float(argv[i + 1])
        del argv[i : i + 2]
    per_row: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    row = {"i": 1}  # the e2e row now running (1-based), advanced by the row summary line
    orig = jit.JITFunction.run

    def run(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = orig(self, *args, **kwargs)
        dt = time.perf_counter() - t0
        if dt * 1e3 > slow_ms:
            key = f"row {row['i']}: {getattr(self, '__name__', self.fn.__name__)}"
            per_row[key] += dt
            counts[key] += 1
            if detail:
                scalars = [a for a in args if isinstance(a, (int, float, bool))]
                consts = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
                print(f"SLOW {dt * 1e3:.0f} ms {key} scalars={scalars} {consts}", flush=True)
        return out

    def log(msg: str) -> None:
        print(msg, flush=True)
        if "tok/s" in msg:  # a row's summary line: the row ended
            segs = torch.cuda.memory_stats().get("segment.all.allocated", 0) if torch.cuda.is_available() else 0
            print(f"  [row {row['i']} ended; cudaMalloc segments so far: {segs}]", flush=True)
            row["i"] += 1

    # Triton's launcher is wrapped for this process only (third-party code: there is no hook that times a launch)
    jit.JITFunction.run = run
    try:
        rc = bench_e2e.main(argv, log=log)
    finally:
        jit.JITFunction.run = orig
    print(f"\nTriton launches slower than {slow_ms} ms on the host, by row (seconds, count):")
    for key in sorted(per_row, key=lambda k: -per_row[k])[:40]:
        print(f"  {per_row[key]:7.3f} s  {counts[key]:4d}x  {key}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
