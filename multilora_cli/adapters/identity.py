"""What an adapter IS, by content: one hash of the files the engine reads from its folder.

Two users need the same answer: the --resume ledger (io/ledger.py: did the adapter that wrote a record change?)
and the prefix cache (engine/block_manager.py: KV computed under one adapter is reused only under the same
weights and config, whatever name they are served under). Hashing by content, not path or mtime, makes a moved
or copied folder the same adapter and a retrained one a different one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

WINDOW = 1 << 20  # bytes hashed at the head, middle and tail of a large weights file
# What the engine reads from an adapter folder (adapters/): other files there (README, training state) do not
# change outputs and may come and go.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def file_digest(h, path: Path) -> None:
    """Feed `path` to `h`: small files whole, large ones (weights) as size + head, middle and tail windows,
    so a multi-GB checkpoint costs 3 MiB of reads while a retrained or replaced one still shows."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        h.update(f"{path.name}\0{size}\0".encode())
        spots = [0] if size <= 3 * WINDOW else [0, size // 2 - WINDOW // 2, size - WINDOW]
        for at in spots:
            f.seek(at)
            h.update(f.read(WINDOW if len(spots) > 1 else size))


def folder_digest(folder: str | Path, names: tuple[str, ...], suffix: str | None = None) -> str:
    """16 hex digits over the files `names` (and every `*suffix` file) directly in `folder`, by content. An
    unreadable file raises OSError (with `.filename` set to it)."""
    d = Path(folder)
    files = {d / n for n in names if (d / n).is_file()}
    if suffix:
        files.update(f for f in d.glob(f"*{suffix}") if f.is_file())
    h = hashlib.blake2b(digest_size=8)
    for f in sorted(files):
        try:
            file_digest(h, f)
        except OSError as e:
            e.filename = e.filename or str(f)
            raise
    return h.hexdigest()


def adapter_identity(folder: str | Path) -> str:
    """The content hash of the adapter in `folder` (what the ledger records per line)."""
    return folder_digest(folder, ADAPTER_FILES)
