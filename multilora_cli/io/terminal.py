"""The run's edges toward the shell besides its results: a closed or vanished stderr, a second Ctrl-C, a late one.

stderr only carries diagnostics (notes, the progress bar, the summary, the final `error:` line). A batch job
writing to `-o FILE` must not die, or exit 1 after finishing every line, because whoever read its stderr went
away (`2>&1 | head`, a log shipper that crashed) or because it was started with stderr closed (`2>&-`). With
stderr closed Python sets sys.stderr to None, and `print(..., file=None)` writes to *stdout*: the notes would
land among the result records.
"""

from __future__ import annotations

import atexit
import io
import os
import signal
import sys
import threading


class _ForgivingStderr:
    """Wraps the real stderr; the first write that fails (EPIPE, EIO, ...) turns every later write into a no-op."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = stream is None

    def write(self, s: str) -> int:
        if not self.broken:
            try:
                self._stream.write(s)
            except (OSError, ValueError):  # ValueError: the stream was closed under us
                self.broken = True
        return len(s)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        try:
            return not self.broken and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self.broken:
            raise io.UnsupportedOperation("stderr is closed")
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name):  # errors, buffer, ... as the real stream has them
        return getattr(self._stream, name)


def guard_stderr() -> None:
    """Route sys.stderr through _ForgivingStderr for the rest of the process (the `error:` line at exit too).

    A closed descriptor 0, 1 or 2 is also taken by /dev/null: otherwise the next file opened (the `-o` output)
    gets that number, and whatever C code writes to "stderr" (torch, tokenizers) lands among the records. The
    Python objects stay None, so `-` / stdout as the output are still refused as closed."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
    if not isinstance(sys.stderr, _ForgivingStderr):
        sys.stderr = _ForgivingStderr(sys.stderr)


def stop_on_next_signal(force: bool) -> None:
    """Called once a Ctrl-C / SIGTERM is being handled: a second one must not raise KeyboardInterrupt again in the
    middle of the cleanup or of the interpreter's exit (that printed a traceback from an atexit callback).

    force: the second signal exits at once (128 + signal, as the shell reports it); whole lines are on disk
    already, and --resume drops a torn last one. Otherwise (worker processes to stop first) it is ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = (lambda signum, frame: os._exit(128 + signum)) if force else signal.SIG_IGN
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def ignore_signals_at_exit() -> None:
    """A Ctrl-C / SIGTERM landing while the interpreter exits (the run is over, its exit code decided) raised
    KeyboardInterrupt inside torch's atexit callbacks: a traceback after a finished run. atexit runs the last
    registered first, so this is registered at the end of the run, after torch registered its callbacks."""
    atexit.register(_ignore_signals)


def _ignore_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
