"""Streaming JSONL input: a path or `-` (stdin), read line by line in binary, never loaded whole.

Blank (whitespace-only) lines are skipped and get no record; every other line gets exactly one record, keyed by
its ordinal among non-blank lines. The format is detected from the first line that is a JSON object (lines
before it that are not, e.g. malformed, still become error records).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from typing import BinaryIO

from multilora_cli.errors import InputError
from multilora_cli.io.formats import Format, detect_format, get_format, parse_line
from multilora_cli.io.line import SIMPLE, LineSpec
from multilora_cli.paths import expand_user

LOOKAHEAD = 1000  # lines held while looking for the first JSON object (format detection)
BOM = b"\xef\xbb\xbf"
# Magic numbers of files people hand over instead of their decompressed JSONL.
COMPRESSED = {b"\x1f\x8b": "gzip", b"(\xb5/\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip"}


def open_input(path: str) -> tuple[BinaryIO, str]:
    """Open INPUT for binary reading: `-` is stdin. Raises InputError (exit 1) naming the path."""
    if path == "-":
        if sys.stdin is None:  # started with `<&-`: Python has no stdin object at all
            raise InputError("INPUT is - but stdin is closed", hint="pipe the JSONL in, or give a file path")
        return sys.stdin.buffer, "<stdin>"
    p = expand_user(path)
    if not p.exists():
        raise InputError(f"input {path} does not exist", hint="give a JSONL file, or - for stdin")
    if p.is_dir():
        raise InputError(f"input {path} is a directory, not a JSONL file")
    try:
        return open(p, "rb"), str(p)
    except OSError as e:
        raise InputError(f"cannot read input {path}: {e.strerror or e}") from e


def count_records(path: str) -> int | None:
    """Non-blank lines of a regular file (for the progress total); None for stdin, pipes and FIFOs."""
    lines = _file_lines(path)
    return None if lines is None else sum(1 for _ in lines)


def _file_lines(path: str) -> Iterator[bytes] | None:
    """The non-blank lines of a regular file (BOMs dropped), read once on demand; None for stdin, pipes, FIFOs
    and a file that cannot be opened (the reader reports it)."""
    if path == "-":
        return None
    try:
        p = expand_user(path)
        if not stat.S_ISREG(os.stat(p).st_mode):
            return None
        f = open(p, "rb")
    except OSError:
        return None
    return _lines_of(f)


def _lines_of(f: BinaryIO) -> Iterator[bytes]:
    with f:
        try:
            for raw in f:
                if line := _content(raw):
                    yield line
        except OSError:
            return


def count_sequences(path: str, max_n: int = 128) -> int | None:
    """Upper bound on the sequences a regular file's lines can run at once: each non-blank line counts its `n`
    (simple `n`, or OpenAI `body.n`; 1 without one, `max_n` when the line cannot be read far enough to tell).
    Only lines that mention `"n"` are parsed, so this costs one read of the file. None for stdin, pipes, FIFOs.
    The engine captures CUDA graphs and compiles kernels only for decode batches up to this bound."""
    lines = _file_lines(path)
    if lines is None:
        return None
    return sum(_line_n(line, max_n) if b'"n"' in line else 1 for line in lines)


# Files up to this size are parsed for `prompt_token_bound`; a larger input fills the largest prefill steps anyway.
PROMPT_BOUND_BYTES = 1 << 20
LINE_SLACK = 8  # tokens a tokenizer may add to a plain prompt (BOS, a leading-space piece)
CHAT_SLACK = 64  # ... to a chat line: the template's own text (role headers, a default system prompt)


def prompt_token_bound(path: str, max_bytes: int = PROMPT_BOUND_BYTES, enough: int = 1 << 16) -> int | None:
    """Estimated upper bound on the prompt tokens of all lines of a regular file of at most `max_bytes` (None:
    stdin, a pipe, a larger file). A token covers at least one byte of text (byte-level BPE; SentencePiece with
    byte fallback), so a line counts its prompt's (and continuation's) UTF-8 bytes plus LINE_SLACK, a chat line
    its messages' JSON bytes plus CHAT_SLACK, token ids their count, a failed line nothing. A hint, not a
    limit: the engine precompiles prefill steps up to it (engine/precompile.py), and a larger step compiles its
    kernels when it comes. Parsing stops once the count passes `enough` (more than any step budget)."""
    specs = small_file_specs(path, max_bytes)
    if specs is None:
        return None
    total = 0
    for spec in specs:
        total += line_token_bound(spec)
        if total > enough:
            break
    return total


def small_file_specs(path: str, max_bytes: int = PROMPT_BOUND_BYTES) -> Iterator[LineSpec] | None:
    """The parsed lines of a regular file of at most `max_bytes` (keys and line numbers counting non-blank lines
    only: for facts about the input, not for records), read on demand; None for stdin, a pipe, a larger file.
    Lines before the first JSON object are skipped (their format is not known yet)."""
    if path == "-":
        return None
    try:
        st = os.stat(expand_user(path))
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        return None
    lines = _file_lines(path)
    return None if lines is None else _specs(lines)


def _specs(lines: Iterator[bytes]) -> Iterator[LineSpec]:
    fmt = None
    for key, raw in enumerate(lines):
        if fmt is None:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            fmt = get_format(detect_format(obj))
        yield parse_line(raw, key, key + 1, fmt)


def line_token_bound(spec: LineSpec) -> int:
    """An upper bound on a line's prompt tokens without its tokenizer: its bytes (a token covers >= 1) + slack."""
    if spec.error is not None:
        return 0  # an error record runs nothing
    if spec.prompt_token_ids is not None:
        return len(spec.prompt_token_ids)
    if spec.messages is not None:
        return len(json.dumps(spec.messages, ensure_ascii=False).encode()) + CHAT_SLACK
    text = (spec.prompt or "") + (spec.continuation or "")
    return len(text.encode("utf-8", "surrogatepass")) + LINE_SLACK


def _line_n(raw: bytes, max_n: int) -> int:
    """The `n` a line asks for: an int in 1..max_n, 1 when none is given or the line fails (an error record runs
    nothing), max_n when the JSON cannot be read (the bound must not fall short)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return max_n
    if not isinstance(obj, dict):
        return 1
    body = obj.get("body")
    n = obj.get("n", body.get("n") if isinstance(body, dict) else None)
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= max_n else 1


def _content(raw: bytes) -> bytes:
    """The line without a UTF-8 BOM; empty when nothing but whitespace is left (a blank line). A BOM is dropped
    on every line, not only the first: `cat a.jsonl b.jsonl` puts b's BOM at the start of a middle line."""
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    return raw if raw.strip() else b""


def _nonblank(stream: BinaryIO, name: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) for every non-blank line."""
    try:
        for lineno, raw in enumerate(stream, 1):
            raw = _content(raw)
            if raw:
                yield lineno, raw
    except OSError as e:
        raise InputError(f"reading {name} failed: {e.strerror or e}") from e


class InputReader:
    """Iterate `LineSpec`s of a JSONL stream in input order. `format` is known right after construction."""

    def __init__(self, stream: BinaryIO, name: str = "<input>"):
        self.name = name
        self._stream = stream
        self._lines = _nonblank(stream, name)
        self._head: list[tuple[int, bytes]] = []
        self.format: Format = get_format(self._detect())

    def _detect(self) -> str:
        for lineno, raw in self._lines:
            if not self._head:
                self._refuse_binary(raw)
            self._head.append((lineno, raw))
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                return detect_format(obj)
            if len(self._head) >= LOOKAHEAD:
                break
        return SIMPLE

    def _refuse_binary(self, first: bytes) -> None:
        """A compressed or binary INPUT is one fatal error, not a record per garbage "line"."""
        kind = next((k for magic, k in COMPRESSED.items() if first.startswith(magic)), None)
        if kind is not None:
            raise InputError(
                f"input {self.name} is a {kind}-compressed file, not JSONL text",
                hint=f"decompress it first, e.g. {'zcat' if kind == 'gzip' else kind + ' -dc'} "
                f"FILE | multilora run - ..."
                if kind != "zip"
                else "unzip it first",
            )
        try:
            first.decode("utf-8")
            text = True
        except UnicodeDecodeError:  # a Latin-1 JSONL line still starts with "{": only those get per-line errors
            text = first.lstrip().startswith((b"{", b"["))
        if b"\x00" in first or not text:
            raise InputError(
                f"input {self.name} is a binary file, not JSONL text (binary data on its first line)",
                hint="give a UTF-8 JSONL file, one JSON object per line",
            )

    @property
    def empty(self) -> bool:
        """True when the input has no non-blank line at all (only valid before iterating)."""
        return not self._head

    def raw_lines(self) -> Iterator[tuple[int, int, bytes]]:
        """(key, lineno, raw bytes) in input order."""
        key = 0
        head, self._head = self._head, []
        for lineno, raw in head:
            yield key, lineno, raw
            key += 1
        for lineno, raw in self._lines:
            yield key, lineno, raw
            key += 1

    def __iter__(self) -> Iterator[LineSpec]:
        for key, lineno, raw in self.raw_lines():
            yield parse_line(raw, key, lineno, self.format)

    def close(self) -> None:
        if self._stream is not getattr(sys.stdin, "buffer", None):  # None: started with `<&-`
            self._stream.close()
