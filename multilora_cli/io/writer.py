"""Ordered output: records arrive in any order, leave in input order, one whole line at a time.

The engine finishes requests in any order; `OrderedWriter` keeps a reorder buffer keyed by the record's
position and writes the longest in-order run as soon as its head is complete, then flushes. Every write is a
whole line, so a killed run leaves a valid prefix (at worst a torn last line, which --resume truncates).
With a `ledger` (io/ledger.py), each record's ledger line is written and flushed before the record itself, so
after a kill the ledger is never behind the output.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO

from multilora_cli.errors import OutputError, UsageError
from multilora_cli.io.record_json import encode_record
from multilora_cli.io.sink import descriptor_of, in_place, open_in_place, real_file
from multilora_cli.paths import expand_user


def open_output(path: str | None, *, append: bool = False, what: str = "output") -> tuple[BinaryIO, str]:
    """Open an output sink: None or `-` is stdout. Raises OutputError (exit 1) before any work is done."""
    if path is None or path == "-":
        if sys.stdout is None:  # started with `>&-`: there is nowhere for the records to go
            raise OutputError(f"stdout is closed, so the {what} records have nowhere to go", hint="give -o PATH")
        return sys.stdout.buffer, "<stdout>"
    p = expand_user(path)
    if p.is_dir():
        raise OutputError(f"{what} {path} is a directory; give a file path")
    try:
        if in_place(p):  # /dev/stderr, a FIFO: a duplicate of the descriptor, not the name opened anew
            return open_in_place(p, "ab" if append else "wb"), str(p)
        return open(p, "ab" if append else "wb"), str(p)
    except OSError as e:
        raise OutputError(
            f"cannot write {what} {path}: {e.strerror or e}", hint="check the directory exists and is writable"
        ) from e


def refuse_clobbering(source: BinaryIO, in_name: str, outputs: dict[str, str | None]) -> None:
    """Refuse (exit 2) an output file that is the input, or another output, under another name: a hard link, or
    the file stdin is redirected from (`- < out.jsonl`). RunConfig already refuses one path spelt twice (./x,
    symlinks); only the file's identity catches these, and `-o` would truncate the input while it is read."""
    seen: dict[tuple[int, int], tuple[str, str]] = {}
    try:
        st = os.fstat(source.fileno())
        if stat.S_ISREG(st.st_mode):  # pipes, ttys and /dev/null are not clobbered by writing
            seen[(st.st_dev, st.st_ino)] = ("INPUT", in_name)
    except (OSError, ValueError, AttributeError):  # an in-memory stream (tests): no file to protect
        pass
    for flag, path in outputs.items():
        if path in (None, "-"):
            continue
        try:
            st = os.stat(expand_user(path))
        except OSError:  # not there yet: it cannot be the same as a file that is
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            other_flag, other = seen[key]
            how, harm = (
                ("a hard link, or stdin redirected from it", "destroy the input")
                if other_flag == "INPUT"
                else ("a hard link", f"overwrite {other_flag}")
            )
            raise UsageError(
                f"{flag} {path} is the same file as {other_flag} {other} ({how}): writing it would "
                f"{harm}; give {flag} another path"
            )
        seen[key] = (flag, path)


def check_writable(path: str, what: str) -> None:
    """Fail now (exit 1) if `path` could not be created or replaced at the end of the run."""
    p = expand_user(path)
    if p.is_dir():
        raise OutputError(f"{what} {path} is a directory; give a file path")
    if in_place(p):  # written where it is (io/sink.py): nothing is created beside it
        fd = descriptor_of(p)
        if not (_fd_writable(fd) if fd is not None else os.access(p, os.W_OK)):
            raise OutputError(
                f"cannot write {what} {path}: "
                + (f"descriptor {fd} is not open for writing" if fd is not None else "permission denied")
            )
        return
    p = real_file(p)  # through a symlink: the probe (and the stats file's rename) go where the file is
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write {what} {path}: directory {parent} does not exist")
    if (p.exists() and not os.access(p, os.W_OK)) or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {what} {path}: permission denied")
    # os.access trusts permission bits (always "yes" for root); only creating a file tells for sure (a
    # read-only mount, /proc, a full quota). The stats file is written there as a temp file + rename.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=parent)
    except OSError as e:
        raise OutputError(
            f"cannot write {what} {path}: cannot create a file in {parent}: {e.strerror or e}",
            hint="choose a writable directory",
        ) from e
    os.close(fd)
    os.unlink(probe)


def _fd_writable(fd: int) -> bool:
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except OSError:  # not open
        return False


class OrderedWriter:
    """Write records in key order starting at `start_key`; error records are also copied to `errors`, their
    ledger lines (`put(tag=...)`) to `ledger`."""

    def __init__(
        self,
        out: BinaryIO,
        errors: BinaryIO | None = None,
        *,
        start_key: int = 0,
        out_name: str = "<output>",
        ledger: BinaryIO | None = None,
        errors_name: str = "<errors>",
    ):
        self._out = out
        self._errors = errors
        self._ledger = ledger
        self._name = out_name
        self._errors_name = errors_name
        self._next = start_key
        self._pending: dict[int, tuple[bytes, bool, str | None]] = {}
        self._lock = threading.Lock()  # the engine may pull the request iterable from another thread
        self.written = 0

    @property
    def next_key(self) -> int:
        return self._next

    @property
    def pending(self) -> int:
        """Records completed but waiting for an earlier one."""
        return len(self._pending)

    def put(self, key: int, record: dict, is_error: bool = False, tag: str | None = None) -> int:
        """Add the record for `key` (and its ledger line `tag`); write every record now in order. Returns how
        many lines were written."""
        line = encode_record(record)
        with self._lock:
            if key < self._next or key in self._pending:
                raise OutputError(f"internal: record {key} written twice")  # never silently duplicate
            self._pending[key] = (line, is_error, tag)
            ready = []
            while self._next in self._pending:
                ready.append(self._pending.pop(self._next))
                self._next += 1
            if not ready:
                return 0
            if self._ledger is not None:
                if any(t is None for _, _, t in ready):
                    raise OutputError(f"internal: a record of {self._name} came without its ledger line")
                self._write_ledger(b"".join(f"{t}\n".encode() for _, _, t in ready))
            for data, err, _ in ready:
                self._write(data, err)
            self._flush()
            self.written += len(ready)
            return len(ready)

    def _write_ledger(self, data: bytes) -> None:
        try:
            self._ledger.write(data)
            self._ledger.flush()  # before the records: the ledger must never be behind the output
        except OSError as e:
            raise OutputError(f"writing the --resume ledger of {self._name} failed: {e.strerror or e}") from e

    def _write(self, data: bytes, is_error: bool) -> None:
        if self._errors is not None and is_error:
            try:
                self._errors.write(data)
            except OSError as e:
                raise self._errors_failed(e) from e
        try:
            self._out.write(data)
        except OSError as e:
            raise self._failed(e) from e

    def _flush(self) -> None:
        if self._errors is not None:
            try:
                self._errors.flush()
            except OSError as e:
                raise self._errors_failed(e) from e
        try:
            self._out.flush()
        except OSError as e:
            raise self._failed(e) from e

    def _errors_failed(self, e: OSError) -> OutputError:
        # the copy of the error records failed, not the output: name the file the user has to look at
        if isinstance(e, BrokenPipeError):
            return OutputError(f"errors file {self._errors_name} was closed by the reader before the run finished")
        return OutputError(f"writing errors file {self._errors_name} failed: {e.strerror or e}")

    def _failed(self, e: OSError) -> OutputError:
        if isinstance(e, BrokenPipeError):
            if self._out is _stdout_buffer():  # `| head`: keep Python from failing again at exit
                try:
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                except (OSError, ValueError):
                    pass
            return OutputError(f"{self._name} was closed by the reader before the run finished")
        return OutputError(f"writing {self._name} failed: {e.strerror or e}")

    def close(self) -> None:
        for f in (self._out, self._errors, self._ledger):
            if f is not None and f is not _stdout_buffer():
                try:
                    f.close()
                except OSError:
                    pass


def _stdout_buffer() -> BinaryIO | None:
    return getattr(sys.stdout, "buffer", None)  # sys.stdout is None when the run was started with `>&-`
