"""First pass over the input for sharding: (adapter, estimated tokens) per line, nothing else kept.

Sharding needs every line's adapter and cost before the first request is sent, but the input is streamed:
this pass reads the file once more, line by line, and keeps two small integers per line (8 bytes), never a
prompt. stdin cannot be read twice, so a data-parallel run spools it to a temporary file first
(`spool_stdin`). The cost estimate is prompt length (UTF-8 bytes / 4, or the token ids given) plus the
line's max_tokens (or the run's default): what a request costs the engine, to within a constant factor.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from multilora_cli.distributed.shard import BASE
from multilora_cli.io.formats import Format, parse_line
from multilora_cli.io.line import LineSpec
from multilora_cli.io.reader import InputReader, open_input

BYTES_PER_TOKEN = 4  # rough, for English text; only the relative cost between lines matters


@dataclass(slots=True)
class LineCosts:
    """Per remaining line (key - start_key): adapter index (BASE = base model) and estimated tokens."""

    start_key: int
    names: list[str] = field(default_factory=list)  # adapter index -> name
    adapters: array = field(default_factory=lambda: array("i"))
    tokens: array = field(default_factory=lambda: array("i"))

    def __len__(self) -> int:
        return len(self.adapters)


def estimate_tokens(spec: LineSpec, default_max_tokens: int) -> int:
    """Prompt tokens (estimated from its text, exact for prompt_token_ids) + max new tokens of each of its n
    samples (the prompt is prefilled once)."""
    if spec.prompt_token_ids is not None:
        prompt = len(spec.prompt_token_ids)
    elif spec.prompt is not None:
        prompt = len(spec.prompt.encode("utf-8", "replace")) // BYTES_PER_TOKEN
    elif spec.messages:
        prompt = sum(len(str(m.get("content", "")).encode("utf-8", "replace")) + 8 for m in spec.messages)
        prompt //= BYTES_PER_TOKEN
    else:
        prompt = 0
    mt = spec.sampling.get("max_tokens")
    new = mt if isinstance(mt, int) and not isinstance(mt, bool) and mt > 0 else default_max_tokens
    n = spec.sampling.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        new *= n
    return max(1, prompt + new)


def scan_costs(
    path: str, start_key: int, adapter_of: Callable[[str | None], str | None], default_max_tokens: int
) -> LineCosts:
    """Read `path` once; costs of lines with key >= start_key (the ones a --resume has not kept).

    `adapter_of(name)` maps a line's adapter name to the adapter it runs on (None = base model); lines that
    will fail anyway (bad JSON, unknown adapter) are costed as base requests: they never reach a worker.
    """
    source, name = open_input(path)
    reader = InputReader(source, name)
    costs = LineCosts(start_key)
    index: dict[str, int] = {}
    try:
        fmt: Format = reader.format
        for key, lineno, raw in reader.raw_lines():
            if key < start_key:
                continue
            spec = parse_line(raw, key, lineno, fmt)
            adapter = None if spec.error is not None else adapter_of(spec.adapter)
            if adapter is None:
                a = BASE
            else:
                a = index.get(adapter)
                if a is None:
                    a = index[adapter] = len(costs.names)
                    costs.names.append(adapter)
            costs.adapters.append(a)
            costs.tokens.append(estimate_tokens(spec, default_max_tokens))
    finally:
        reader.close()
    return costs


def spool_stdin(directory: str | None = None) -> str:
    """Copy stdin to a temporary file (streamed) and return its path; the caller deletes it."""
    tmp = tempfile.NamedTemporaryFile(prefix="multilora-stdin-", suffix=".jsonl", dir=directory, delete=False)
    with tmp:
        shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
    return tmp.name
