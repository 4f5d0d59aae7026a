"""Tests only: `MULTILORA_TEST_SIGNAL_AFTER=SIGNAL:N` (e.g. `SIGKILL:5`) makes a run signal itself once N
records of this run are written.

The kill -9 / SIGTERM / Ctrl-C tests of `multilora run` stop it at this point instead of racing it: the signal
goes out right after the write that brought the output to N or more records (one write may add several: a
finished line frees the later ones waiting for it), and nothing more is written before its handler runs, so the
output holds exactly the records counted then. Read once, when the job starts (RunJob); unset, it costs nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

TEST_SIGNAL_ENV = "MULTILORA_TEST_SIGNAL_AFTER"


@dataclass(frozen=True, slots=True)
class SignalAfter:
    """Send `signum` to this process once `records` records are written."""

    signum: int
    records: int

    @classmethod
    def from_env(cls) -> SignalAfter | None:
        spec = os.environ.get(TEST_SIGNAL_ENV, "")
        if not spec:
            return None
        name, _, n = spec.partition(":")
        return cls(signal.Signals[name.strip().upper()].value, int(n))

    def due(self, written: int) -> bool:
        return written >= self.records

    def fire(self) -> None:
        """Signal this process; on the main thread, wait here for the handler (it raises KeyboardInterrupt for
        SIGINT and, through cli.py, SIGTERM; SIGKILL ends the process), so the job does nothing in between."""
        os.kill(os.getpid(), self.signum)
        if threading.current_thread() is threading.main_thread():
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                time.sleep(0.01)  # the handler runs inside this sleep, or right after it
            raise RuntimeError(f"{TEST_SIGNAL_ENV}: signal {self.signum} had no effect within 10 s")
