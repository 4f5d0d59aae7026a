"""Compile Triton kernel variants in forked child processes, into Triton's disk cache (kernels/launch.compile_all).

Why: a compile's Python front end (the code generator's many short calls into MLIR) queues for the GIL behind
every other thread, so a pool of threads serializes the front ends of all variants: measured on a 2-core host
for target sm_90 (Triton 3.9), 17 sampler variants took 13.2 s one by one, 10.5 s from 2 threads and 8.4 s from 2
forked processes; the row program's front end took 0.20 s alone and 2.13 s beside one busy Python thread.

How: each child is a fork of this process taken after the dry run, so it holds the recorded launches and the
kernels' JIT state without pickling or re-importing anything. It must not touch CUDA (a context made before the
fork is unusable there), so it swaps Triton's active driver for `_CompileOnly`, which answers the questions a
warm-up asks (current device, stream, target) with the parent's answers and nothing else, then runs
`kernel.warmup` per variant: the same binder, specialisation, options and target as the parent's own warm-up,
hence the same cache key. The parent then warms every variant as before: each is a cache load, plus its
launcher and its module on the GPU. A child that fails only leaves its variants to the parent, which compiles
what the cache lacks.
"""

from __future__ import annotations

import os
import signal
import sys
import time


class _CompileOnly:
    """Triton's driver for a forked child: the parent's device, stream and target; nothing that needs CUDA."""

    def __init__(self, device: int, target):
        self._device, self._target = device, target

    def get_current_device(self) -> int:
        return self._device

    def get_current_stream(self, device=None) -> int:
        return 0  # read by JITFunction.run, used only to launch (a warm-up never launches)

    def get_current_target(self):
        return self._target

    def __getattr__(self, name):  # anything else would touch the GPU: fail the child, not hang it
        raise AttributeError(f"compile-only driver (a forked compile child) has no {name!r}")


def compile_in_children(calls: list, processes: int, compile_one, timeout_s: float = 300.0) -> int:
    """Fork `processes` children that run `compile_one(call)` (a warm-up only: no launcher, nothing on the GPU)
    on calls[w::processes] each (so the longest-first order spreads over them) under `_CompileOnly`; wait for
    them, killing any still running after `timeout_s` (a child stuck on a lock another thread of this process
    held at the fork). Returns how many exited cleanly."""
    if processes < 2 or not calls or not hasattr(os, "fork"):
        return 0
    from triton.runtime import driver

    device, target = driver.active.get_current_device(), driver.active.get_current_target()
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for w in range(min(processes, len(calls))):
        pid = os.fork()
        if pid == 0:  # the child: compile its share, then leave without the parent's exit hooks or buffers
            code = 1
            try:
                driver.set_active(_CompileOnly(device, target))
                for call in calls[w::processes]:
                    compile_one(call)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    ok, deadline = 0, time.monotonic() + timeout_s
    while pids:
        for pid in list(pids):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pids.remove(pid)
                ok += os.waitstatus_to_exitcode(status) == 0
        if pids and time.monotonic() > deadline:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    return ok
