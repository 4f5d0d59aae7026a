"""One input line, parsed (`LineSpec`), and the checks both formats share (chat messages, JSON type names).

Parsing never raises for a bad line: the problem lands in `LineSpec.error` and becomes that line's error record,
so one bad line never costs another line its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from multilora_cli.errors import RequestError
from multilora_cli.io.logprob_records import Entry

SIMPLE = "simple"
OPENAI = "openai"

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n")
# logits processing (config.SamplingParams says whose semantics each has)
SAMPLING_FIELDS += ("min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias")
SAMPLING_FIELDS += ("min_tokens", "stop_token_ids", "ignore_eos")
SAMPLING_FIELDS += ("logprobs", "prompt_logprobs")  # the model's raw log-softmax (engine/logprobs.py)
# structured output (constraint.py): the simple format takes all three, an OpenAI body response_format only
CONSTRAINT_FIELDS = ("response_format", "regex", "choice")
Choice = tuple[str, str | None]  # one of a line's n > 1 samples in its record: (text, finish_reason)


@dataclass(slots=True)
class LineLogprobs:
    """The logprobs a line's record shows, as entries (io/logprob_records.Entry: id, token, logprob, top [(id, token,
    logprob)], the engine's TokenLogprob as it is); io/logprob_json.py writes each format's shape of them.

    choices: per sample (index order), one entry per generated token; None where the line did not ask.
    prompt: one entry per prompt token, the first with logprob None (nothing predicts it); None: not asked.
    echo: the prompt's text, for OpenAI completions' `echo`."""

    choices: list[list[Entry] | None] | None = None
    prompt: list[Entry] | None = None
    echo: str | None = None


@dataclass(slots=True)
class LineSpec:
    """One non-blank input line, parsed. `key` orders the output; `id` is echoed in the record.

    `id` keeps the JSON value the user gave (string or integer); it defaults to the 1-based line number.
    `adapter` is the name as written (None = not given); the run maps it to an adapter or the base model.
    """

    key: int  # 0-based ordinal among non-blank lines = position of the record in the output
    lineno: int  # 1-based physical line number (blank lines count)
    id: Any
    adapter: str | None = None
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_token_ids: list[int] | None = None
    continuation: str | None = None  # a scoring line's text to score after the prompt (no generation)
    echo: bool = False  # OpenAI completions: the record's text starts with the prompt
    generate: bool = True  # False: OpenAI echo with max_tokens 0 (prompt logprobs only)
    sampling: dict = field(default_factory=dict)  # the line's own sampling fields, validated later
    meta: dict = field(default_factory=dict)  # format specifics echoed in the record (OpenAI url, model)
    error: RequestError | None = None

    def fail(self, message: str, code: str = "invalid_request") -> LineSpec:
        """Mark this line failed (first failure wins) and return it."""
        if self.error is None:
            self.error = RequestError(f"line {self.lineno}: {message}", code=code)
        return self


def json_type(v: Any) -> str:
    """A JSON type name for messages: 'a string', 'an array', ..."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


# Roles chat templates know. An unknown role is passed through (a model's template may define its own), unless
# it looks like a misspelling of one of these, which a template would render as a stranger's turn.
ROLES = ("system", "user", "assistant", "tool", "developer")


def _role_near_miss(role: str) -> str | None:
    import difflib

    if role in ROLES:
        return None
    low = role.strip().lower()
    if low in ROLES:
        return low  # "User", " user": templates compare roles exactly
    close = difflib.get_close_matches(low, ROLES, n=1, cutoff=0.6)
    return close[0] if close else None


def check_messages(spec: LineSpec, messages: Any) -> list[dict] | None:
    """Validate chat messages: a non-empty list of {role: str, content: str | [text parts]}."""
    if not isinstance(messages, list) or not messages:
        got = "an empty array" if messages == [] else json_type(messages)
        spec.fail(f"messages must be a non-empty array of {{role, content}} objects, got {got}")
        return None
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"].strip():
            spec.fail(f"messages[{i}] must be an object with a non-empty string 'role'")
            return None
        if (known := _role_near_miss(m["role"])) is not None:
            spec.fail(
                f"messages[{i}].role {m['role']!r} is not a chat role: did you mean {known!r}? "
                f"(roles: {', '.join(ROLES)}; others go to the chat template as written)",
                "unknown_role",
            )
            return None
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep text parts only
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    spec.fail(f"messages[{i}].content: only text parts are supported")
                    return None
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            spec.fail(f"messages[{i}].content must be a string, got {json_type(content)}")
            return None
        out.append({**m, "content": content})
    return out
