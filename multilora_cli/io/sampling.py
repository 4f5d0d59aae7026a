"""Sampling precedence: the line's own fields > CLI flags > the model's generation_config.json > greedy, 256 tokens.

A bad CLI flag is a usage error (exit 2); a bad field on a line becomes that line's error record.
`--seed` is the run's seed: a line that samples without its own seed gets one derived from (run seed, line
position), so its text is reproducible, independent of other lines, and the same after --resume.
"""

from __future__ import annotations

import hashlib

from multilora_cli.config import SamplingParams
from multilora_cli.errors import ConfigError, UsageError
from multilora_cli.io.formats import LineSpec

FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")
FALLBACK = {"max_tokens": 256, "temperature": 0.0}


def valid_only(fields: dict) -> dict:
    """Keep the sampling fields that SamplingParams accepts on their own."""
    keep = {}
    for k, v in fields.items():
        if k not in FIELDS:
            continue
        try:
            SamplingParams(**{k: v})
        except (ConfigError, TypeError):
            continue
        keep[k] = v
    return keep


class SamplingResolver:
    """Merge the layers once per line. `cli` holds only the flags the user gave."""

    def __init__(self, model_defaults: dict | None = None, cli: dict | None = None, run_seed: int = 0):
        self.base = {**FALLBACK, **valid_only(model_defaults or {})}
        self.base.pop("seed", None)
        cli = {k: v for k, v in (cli or {}).items() if v is not None and k != "seed"}
        self.run_seed = run_seed
        try:
            SamplingParams(**{**self.base, **cli})
        except ConfigError as e:
            raise UsageError(f"invalid sampling flag: {e.message}") from e
        self.base.update(cli)

    @property
    def defaults(self) -> SamplingParams:
        return SamplingParams(**self.base)

    def resolve(self, spec: LineSpec) -> SamplingParams | None:
        """SamplingParams for the line, or None with `spec.error` set."""
        try:
            params = SamplingParams(**{**self.base, **spec.sampling})
        except ConfigError as e:
            spec.fail(e.message, "invalid_sampling")
            return None
        except TypeError as e:  # an unexpected key: formats only pass FIELDS, so this is a bug
            spec.fail(str(e))
            return None
        if params.seed is None and not params.greedy:
            params.seed = line_seed(self.run_seed, spec.key)
        return params


def line_seed(run_seed: int, key: int) -> int:
    """A 63-bit seed for line `key` of a run seeded with `run_seed` (stable across processes)."""
    digest = hashlib.sha256(f"{run_seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
