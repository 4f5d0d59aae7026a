"""`AdapterTally`: one adapter's request and token counts, kept by the engine (`EngineStats`) and by the run
(`io/stats.RunStats`). Below both, so neither imports the other for it.

Keys: the adapter's name, "base" for requests without one (`tally_of`). The engine counts only what it
generated (it never sees most error records), so its dicts leave `errors` out (`to_dict(errors=False)`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AdapterTally:
    """requests: records (ok + error) for the run; generated results for the engine. slot_loads: times the
    adapter was copied into a GPU slot."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slot_loads: int = 0

    def add_ok(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def add_error(self) -> None:
        self.requests += 1
        self.errors += 1

    def to_dict(self, *, errors: bool = True) -> dict[str, int]:
        """The counts in field order; without `errors` when the counter does not keep them (the engine)."""
        d = {
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "slot_loads": self.slot_loads,
        }
        if not errors:
            del d["errors"]
        return d


def tally_of(tallies: dict[str, AdapterTally], adapter: str | None) -> AdapterTally:
    """The tally of `adapter` (None or "" = "base") in `tallies`, added at zero on first use."""
    key = adapter or "base"
    if key not in tallies:
        tallies[key] = AdapterTally()
    return tallies[key]
