"""Sampling precedence: the line's own fields > CLI flags > the model's generation_config.json > greedy, 256 tokens.

A bad CLI flag is a usage error (exit 2); a bad field on a line becomes that line's error record.
`--seed` is the run's seed (EngineConfig.seed), not a per-line one: the engine derives the seed of a line that
samples without its own from (run seed, line position), so its text is reproducible and the same after --resume.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from multilora_cli.config import SamplingParams
from multilora_cli.constraint import FIELDS as CONSTRAINT_FIELDS
from multilora_cli.constraint import parse_constraint
from multilora_cli.errors import ConfigError, UsageError
from multilora_cli.io.line import SAMPLING_FIELDS, LineSpec

FIELDS = SAMPLING_FIELDS
FALLBACK = {"max_tokens": 256, "temperature": 0.0}


def valid_only(fields: dict) -> dict:
    """Keep the sampling fields that SamplingParams accepts on their own (min_tokens whatever max_tokens is: the
    two are checked together per line)."""
    keep = {}
    for k, v in fields.items():
        if k not in FIELDS:
            continue
        try:
            alone = {k: v, "max_tokens": v} if k == "min_tokens" and isinstance(v, int) and v > 0 else {k: v}
            SamplingParams(**alone)
        except (ConfigError, TypeError):
            continue
        keep[k] = v
    return keep


@dataclass(frozen=True, slots=True)
class SamplingFlags:
    """The run's sampling flags (--max-tokens, --temperature, --top-p, --top-k, --min-p, --repetition-penalty,
    --frequency-penalty, --presence-penalty, --min-tokens); None = not given. Checked once, here, by
    SamplingParams' own rules: a bad value is a UsageError naming the flag (exit 2), not a line error.
    --min-tokens above --max-tokens is one too; above a max_tokens from elsewhere (generation_config.json, the
    default 256, a line) it fails the lines it applies to."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    min_tokens: int | None = None

    def __post_init__(self) -> None:
        given = self.given()
        if self.max_tokens is None and isinstance(self.min_tokens, int) and self.min_tokens > 0:
            given["max_tokens"] = self.min_tokens  # checked against --max-tokens only (see above)
        try:
            SamplingParams(**given)
        except ConfigError as e:
            field, _, rest = e.message.partition(" ")  # "temperature must be ...": name the flag the user typed
            raise UsageError(f"--{field.replace('_', '-')} {rest}") from e

    def given(self) -> dict:
        """{field: value} of the flags given."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


class SamplingResolver:
    """Merge the layers once per line: `model_defaults` (generation_config.json) under the run's `cli` flags."""

    def __init__(self, model_defaults: dict | None = None, cli: SamplingFlags | None = None):
        self.base = {**FALLBACK, **valid_only(model_defaults or {})}
        self.base.pop("seed", None)
        self.base.update((cli or SamplingFlags()).given())

    @property
    def defaults(self) -> SamplingParams:
        return SamplingParams(**self.base)

    def resolve(self, spec: LineSpec) -> SamplingParams | None:
        """SamplingParams for the line, or None with `spec.error` set."""
        own = {k: v for k, v in spec.sampling.items() if k not in CONSTRAINT_FIELDS}
        try:
            params = SamplingParams(**{**self.base, **own}, constraint=parse_constraint(spec.sampling))
        except ConfigError as e:
            spec.fail(e.message, "invalid_sampling")
            return None
        except TypeError as e:  # an unexpected key: formats only pass FIELDS, so this is a bug
            spec.fail(str(e))
            return None
        return params
