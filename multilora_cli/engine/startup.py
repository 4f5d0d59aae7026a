"""What an engine paid before its first step, as the run's stats report it (`"startup"`; profile_cold_start).

    {"process_s": seconds from the process's start to the engine's (imports, pre-flight; None off Linux),
     "engine_s": the engine's own start (model, KV cache, precompile, arena), "precompile_s", "precompiled",
     "capture_s": decode-graph capture so far (lazy: inside the steps), "arena_s", "kv_blocks",
     "first_step_s": seconds from the process's start to the first step's sampled ids (None: no step ran),
     "triton_at_start" / "triton_in_steps": kernels/compile_log.py's counts (compiled, loaded, seconds),
     "kernels": "triton" | "torch", the path of the LoRA, sampling and logprob ops (kernels.kernel_path),
     "logprob_lm_head": how a step with logprob rows runs the LM head (models/head_check.py's HeadGemms.stats:
     "path" "one_gemm" | "two_gemms" | "mixed", the row counts of each, the check's seconds)}

A one-shot job (the 14-line demo) is mostly this: on an H200 host 14.8 s cold, 5.2 s warm, of which 3.9-4.7 s are
imports (benchmarks/RESULTS.md, issue 36).
"""

from __future__ import annotations

import os
import time

from multilora_cli.kernels import kernel_path


def process_seconds() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime, 10 ms
    resolution); None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        # field 22 (starttime, clock ticks since boot); the command name (field 2) may hold spaces: skip past ')'
        start_ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Started when the engine starts (`t0`, perf_counter); `ready` when it can run its first step."""

    def __init__(self):
        self.process_s = process_seconds()
        self.t0 = time.perf_counter()
        self.engine_s = 0.0

    def ready(self) -> None:
        self.engine_s = time.perf_counter() - self.t0

    def section(self, runner, arena_s: float) -> dict:
        """The stats' "startup" dict for an engine with ModelRunner `runner`."""
        r = lambda v: None if v is None else round(v, 3)  # noqa: E731
        first = None  # the first step's ids read back (runner.first_done, perf_counter), from the process's start
        if runner.first_done is not None and self.process_s is not None:
            first = self.process_s + runner.first_done - self.t0
        return {
            "process_s": r(self.process_s),
            "engine_s": r(self.engine_s),
            "precompile_s": r(runner.precompile_seconds),
            "precompiled": runner.precompiled,
            "capture_s": r(runner.capture_seconds),
            "arena_s": r(arena_s),
            "kv_blocks": runner.num_blocks,
            "first_step_s": r(first),
            "kernels": kernel_path(runner.device),
            **runner.triton_counts(),
            "logprob_lm_head": runner.head_gemms.stats(),
        }
