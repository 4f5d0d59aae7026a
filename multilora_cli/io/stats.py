"""Run statistics: what this run produced, per adapter, and what it cost. Feeds `--stats FILE` and the summary.

The JSON (`RunStats.to_dict`) is read by `multilora economics --stats`. Fields:
  model, device, dtype, input, output, format
  records (lines in the output at the end), resumed (records kept from an earlier run), requests (records this
  run), ok, errors, error_codes {code: n}, kept_errors
  prompt_tokens, completion_tokens, total_tokens
  wall_seconds (whole job, model load included: what a GPU-hour costs), generation_seconds (engine time),
  tokens_per_second / completion_tokens_per_second / requests_per_second (ok ones; all over generation_seconds)
  per_adapter {name | "base" | "(unread)": {requests, errors, prompt_tokens, completion_tokens, slot_loads}}
    ("(unread)": error records of lines unreadable before they named an adapter: bad JSON, no body.model, ...)
  slot_loads, slot_hits, slot_evictions, max_loras, max_lora_rank
  prefix_cache {prompt_tokens, hit_tokens, hit_rate}: tokens the engine started sequences with (prompts, and the
    recompute of a preempted one) and of those the ones whose KV came from the prefix cache (0 with it off)
  cost: null, or {gpu_hour_usd, usd_total (over wall_seconds), usd_per_1m_tokens, usd_per_1m_completion_tokens}
  engine: EngineStats.to_dict() as the engine reported it
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from multilora_cli.errors import OutputError
from multilora_cli.io.sink import in_place, open_in_place, real_file
from multilora_cli.tally import AdapterTally, tally_of


@dataclass(slots=True)
class RunStats:
    """Counted by the run from the records it writes (not from the engine), so it also covers error records."""

    resumed: int = 0
    kept_errors: int = 0
    ok: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_codes: Counter = field(default_factory=Counter)
    per_adapter: dict[str, AdapterTally] = field(default_factory=dict)

    def add_ok(self, adapter: str | None, prompt_tokens: int, completion_tokens: int) -> None:
        tally_of(self.per_adapter, adapter).add_ok(prompt_tokens, completion_tokens)
        self.ok += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def add_error(self, adapter: str | None, code: str) -> None:
        """An error record; `adapter` is the name the line asked for (None = base)."""
        tally_of(self.per_adapter, adapter).add_error()
        self.errors += 1
        self.error_codes[code] += 1

    @property
    def requests(self) -> int:
        return self.ok + self.errors

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(
        self, *, engine: dict | None = None, wall_seconds: float = 0.0, gpu_hour_usd: float | None = None, **info
    ) -> dict:
        """The stats JSON. `engine` is EngineStats.to_dict() (or None when no engine ran); `info` adds
        model/device/dtype/input/output/format."""
        engine = engine or {}
        gen = float(engine.get("wall_seconds") or 0.0) or wall_seconds
        per_adapter = {k: v.to_dict() for k, v in sorted(self.per_adapter.items())}
        for name, a in (engine.get("per_adapter") or {}).items():
            per_adapter.setdefault(name, AdapterTally().to_dict())["slot_loads"] = int(a.get("slot_loads", 0))
        d = {
            "model": engine.get("model", ""),
            "device": engine.get("device", ""),
            "dtype": engine.get("dtype", ""),
            **info,
            "records": self.resumed + self.requests,
            "resumed": self.resumed,
            "kept_errors": self.kept_errors,
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.errors,
            "error_codes": dict(sorted(self.error_codes.items())),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "wall_seconds": round(wall_seconds, 4),
            "generation_seconds": round(gen, 4),
            "tokens_per_second": self.total_tokens / gen if gen > 0 else 0.0,
            "completion_tokens_per_second": self.completion_tokens / gen if gen > 0 else 0.0,
            "requests_per_second": self.ok / gen if gen > 0 else 0.0,  # completed requests
            "per_adapter": per_adapter,
            "slot_loads": int(engine.get("slot_loads", 0)),
            "slot_hits": int(engine.get("slot_hits", 0)),
            "slot_evictions": int(engine.get("slot_evictions", 0)),
            "max_loras": int(engine.get("max_loras", 0)),
            "max_lora_rank": int(engine.get("max_lora_rank", 0)),
            "prefix_cache": dict(engine.get("prefix_cache") or {"prompt_tokens": 0, "hit_tokens": 0, "hit_rate": 0.0}),
            "cost": cost(gpu_hour_usd, wall_seconds, self.total_tokens, self.completion_tokens),
            "engine": engine,
        }
        return d


def cost(gpu_hour_usd: float | None, wall_seconds: float, total_tokens: int, completion_tokens: int) -> dict | None:
    """USD for `wall_seconds` of one GPU at `gpu_hour_usd`, total and per 1M tokens (None where no tokens)."""
    if gpu_hour_usd is None:
        return None
    usd = gpu_hour_usd * wall_seconds / 3600.0
    return {
        "gpu_hour_usd": gpu_hour_usd,
        "usd_total": usd,
        "usd_per_1m_tokens": usd / total_tokens * 1e6 if total_tokens else None,
        "usd_per_1m_completion_tokens": usd / completion_tokens * 1e6 if completion_tokens else None,
    }


def write_stats(path: str, stats: dict) -> None:
    """Write the stats JSON atomically (temp file + rename), so a reader never sees half a file; a FIFO or a
    descriptor (/dev/stderr) is written in place."""
    data = (json.dumps(stats, indent=2) + "\n").encode()
    try:
        if in_place(path):  # /dev/stderr, a FIFO: a rename would replace it with a regular file (io/sink.py)
            with open_in_place(path) as f:
                f.write(data)
            return
        p = real_file(path)  # through a symlink: replace the file it points to, not the link
        tmp = p.with_name(p.name + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, p)
    except OSError as e:
        raise OutputError(f"cannot write stats {path}: {e.strerror or e}") from e
