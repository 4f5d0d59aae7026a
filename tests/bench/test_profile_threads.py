"""profile_decode's thread report: which threads used the CPU over a window, by their Python names."""

from __future__ import annotations

import os
import threading
import time

import pytest

from benchmarks.profile_decode import busy_threads, thread_cpu_ns

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux /proc only")


def test_a_spinning_thread_is_named_and_a_sleeping_one_is_not(capsys):
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin, name="spinner")
    idle = threading.Thread(target=stop.wait, name="sleeper")
    busy.start()
    idle.start()
    try:
        before, t0 = thread_cpu_ns(), time.perf_counter()
        time.sleep(0.3)
        busy_threads(before, time.perf_counter() - t0)
    finally:
        stop.set()
        busy.join()
        idle.join()
    line = capsys.readouterr().out
    assert line.startswith("  threads busy over those") and "spinner" in line and "sleeper" not in line
