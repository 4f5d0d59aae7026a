"""Output paths that are not a plain file of their own: a descriptor's name (/dev/stderr, /dev/fd/N), a FIFO or a
terminal, a symlink.

Such a target is written where it is. The stats file is otherwise replaced atomically (temp file + rename), and
the writability check creates a probe file beside the path; beside a FIFO or a symlink that replaced the FIFO or
the link with a regular file (as root, /dev/stderr too), and in /dev/fd no file can be created at all.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from multilora_cli.paths import expand_user

NAMED_FDS = {"stdout": 1, "stderr": 2}


def descriptor_of(path: str | Path) -> int | None:
    """N when `path` names this process's open descriptor N: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N
    (also with this process's pid). Opening that name anew would truncate a file the shell redirected the
    descriptor to, under the writes already made through it: a duplicate of the descriptor shares its offset."""
    parts = expand_user(path).absolute().parts
    if parts[1:2] == ("dev",) and len(parts) == 3:
        return NAMED_FDS.get(parts[2])
    if parts[1:3] == ("dev", "fd") and len(parts) == 4:
        return int(parts[3]) if parts[3].isdigit() else None
    if parts[1:2] == ("proc",) and len(parts) == 5 and parts[2] in ("self", str(os.getpid())) and parts[3] == "fd":
        return int(parts[4]) if parts[4].isdigit() else None
    return None


def names_a_descriptor(output: str | Path) -> bool:
    """True for /dev/stdout, /dev/stderr, /dev/fd/N, /proc/PID/fd/N: a name for an open descriptor (of any process,
    unlike `descriptor_of`). An -o there gets no --resume ledger: even when it leads to a regular file (`-o
    /dev/stdout > out.jsonl`), "beside it" is /dev or /proc, where the ledger would land for every such run, or
    fail to be created and stop the run."""
    parts = expand_user(output).absolute().parts
    return parts[1:3] in (("dev", "stdout"), ("dev", "stderr"), ("dev", "fd")) or (
        parts[1:2] == ("proc",) and len(parts) > 4 and parts[3] == "fd"
    )


def in_place(path: str | Path) -> bool:
    """True when `path` must be written where it is: a descriptor's name, or an existing FIFO, terminal, socket."""
    if descriptor_of(path) is not None:
        return True
    try:
        return not stat.S_ISREG(os.stat(expand_user(path)).st_mode)
    except OSError:  # not there yet (or a dangling link): a new regular file
        return False


def real_file(path: str | Path) -> Path:
    """The file a regular-file `path` stands for: through symlinks, so that the link itself is not replaced."""
    return Path(os.path.realpath(expand_user(path)))


def open_in_place(path: str | Path, mode: str = "wb") -> BinaryIO:
    """Open an in_place() target for writing. Raises OSError."""
    fd = descriptor_of(path)
    if fd is not None:
        return os.fdopen(os.dup(fd), mode)
    return open(expand_user(path), mode)
