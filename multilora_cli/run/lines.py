"""The input side of a run, line by line: duplicate ids, which engine adapter a line names (or why it fails),
the engine request it becomes, and the adapter name its record is tallied under in the stats."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from multilora_cli.errors import MultiloraError
from multilora_cli.io.line import LineSpec
from multilora_cli.run.setup import why

# Error records whose line could not be read far enough to name an adapter are tallied apart from "base".
UNREAD = "(unread)"
UNREAD_CODES = frozenset(
    {
        "invalid_json",
        "invalid_utf8",
        "missing_custom_id",
        "invalid_method",
        "invalid_url",
        "missing_body",
        "missing_model",
    }
)


def unique_ids(specs: Iterator[LineSpec], seen: set[str]) -> Iterator[LineSpec]:
    """Duplicate ids (compared as text: 7 and "7" collide) fail the later line; `seen`: the ids so far."""
    for spec in specs:
        if spec.id is not None:
            k = str(spec.id)
            if k in seen:
                spec.fail(f"duplicate id {spec.id!r}: an earlier line has the same id", "duplicate_id")
            else:
                seen.add(k)
        yield spec


def admit(
    spec: LineSpec, good: Collection[str], base_names: Collection[str], errors: Mapping[str, MultiloraError]
) -> str | None:
    """Map the line's adapter name to an engine adapter (None = base); fail unknown / broken ones. `good`: the
    adapters that passed pre-flight, `errors`: why the others failed it."""
    name = spec.adapter
    if spec.error is not None or name is None or name in base_names:
        return None
    if name in good:
        return name
    if name in errors:
        err = errors[name]
        spec.fail(f"adapter {name!r} failed pre-flight: {why(name, err)}", err.code)
    else:
        known = ", ".join(sorted(good)) or "none"
        spec.fail(f"unknown adapter {name!r} (known: {known}; add it with --adapters {name}=PATH)", "unknown_adapter")
    return None


def to_request(spec: LineSpec, adapter: str | None, params):
    """The engine request of an admitted line (params: its resolved SamplingParams). The line lets go of its
    prompt: the engine holds it now."""
    from multilora_cli.engine.request import Request

    req = Request(
        key=spec.key,
        id=str(spec.id),
        adapter=adapter,
        prompt=spec.prompt,
        messages=spec.messages,
        prompt_token_ids=spec.prompt_token_ids,
        sampling=params,
        continuation=spec.continuation,
        generate=spec.generate,
        echo=spec.echo,
    )
    spec.prompt = spec.messages = spec.prompt_token_ids = None
    return req


def stat_name(spec: LineSpec, base_names: Collection[str]) -> str | None:
    """The adapter a line's record counts under in the stats: None for the base, UNREAD for a line that never
    said which adapter."""
    name = spec.adapter
    if name is None and spec.error is not None and (spec.error.code in UNREAD_CODES or "adapter_raw" in spec.meta):
        return UNREAD  # the line never said which adapter: not a base request
    return None if name is None or name in base_names else str(name)
