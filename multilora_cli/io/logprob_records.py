"""Logprob entries -> the shapes each format's records use, as plain dicts and lists.

An entry (`Entry`: engine/request.TokenLogprob's shape) is written by the simple format as
{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}]} (`entry`). OpenAI's shapes:
- /v1/completions (legacy): {"tokens": [str], "token_logprobs": [float | null], "top_logprobs": [{token: logprob}
  | null], "text_offset": [int]}: text_offset is each token's character offset in prompt + completion (the prompt's
  length for the first generated token);
- /v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}], "refusal": null}; `bytes` is the token text's UTF-8.
A token is its own text decoded alone (a byte of a multi-byte character decodes to U+FFFD).

Records carry these as JSON text (io/logprob_json.py writes the same bytes without the dicts); these plain
values are the definition it is tested against, and what a record's RawJson stands for (io/record_json.py).
"""

from __future__ import annotations

from typing import Protocol


class Entry(Protocol):
    """One token's logprob entry (engine/request.TokenLogprob has this shape): `top` is (id, text, logprob) for
    the k most likely tokens, most likely first; `logprob` None for a prompt's first token."""

    id: int
    token: str
    logprob: float | None
    top: list[tuple[int, str, float]]


def entry(t: Entry) -> dict:
    """{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}, ...]} (most likely first)."""
    top = [{"id": i, "token": s, "logprob": v} for i, s, v in t.top]
    return {"id": t.id, "token": t.token, "logprob": t.logprob, "top_logprobs": top}


def simple(entries: list[Entry]) -> list[dict]:
    """The simple format's "logprobs"."""
    return [entry(t) for t in entries]


def simple_prompt(entries: list[Entry]) -> list[dict | None]:
    """The simple format's prompt_logprobs: null for the first prompt token, then its entries."""
    return [None, *simple(entries[1:])]


def legacy(entries: list[Entry], text_offset: int) -> dict:
    """OpenAI completions' logprobs object for `entries` (prompt entries first with echo), the first token at
    character `text_offset`."""
    tokens, lps, tops, offsets = [], [], [], []
    at = text_offset
    for e in entries:
        tokens.append(e.token)
        lps.append(e.logprob)
        tops.append(None if e.logprob is None else {s: v for _, s, v in e.top})
        offsets.append(at)
        at += len(e.token)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_token(token: str, logprob: float | None) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat(entries: list[Entry]) -> dict:
    """OpenAI chat completions' logprobs object for the generated tokens' `entries`."""
    content = [
        {**_chat_token(e.token, e.logprob), "top_logprobs": [_chat_token(s, v) for _, s, v in e.top]} for e in entries
    ]
    return {"content": content, "refusal": None}
