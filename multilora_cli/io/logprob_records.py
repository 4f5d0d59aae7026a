"""Logprob entries -> the shapes each format's records use.

An entry (io/line.LineLogprobs) is {"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}]}: the
simple format writes it as it is. OpenAI's shapes:
- /v1/completions (legacy): {"tokens": [str], "token_logprobs": [float | null], "top_logprobs": [{token: logprob}
  | null], "text_offset": [int]}: text_offset is each token's character offset in prompt + completion (the prompt's
  length for the first generated token);
- /v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}], "refusal": null}; `bytes` is the token text's UTF-8.
A token is its own text decoded alone (a byte of a multi-byte character decodes to U+FFFD).
"""

from __future__ import annotations


def simple_prompt(entries: list[dict]) -> list[dict | None]:
    """The simple format's prompt_logprobs: null for the first prompt token, then its entries."""
    return [None, *entries[1:]]


def legacy(entries: list[dict], text_offset: int) -> dict:
    """OpenAI completions' logprobs object for `entries` (prompt entries first with echo), the first token at
    character `text_offset`."""
    tokens, lps, tops, offsets = [], [], [], []
    at = text_offset
    for e in entries:
        tokens.append(e["token"])
        lps.append(e["logprob"])
        tops.append(None if e["logprob"] is None else {t["token"]: t["logprob"] for t in e["top_logprobs"]})
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_token(e: dict) -> dict:
    return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode("utf-8"))}


def chat(entries: list[dict]) -> dict:
    """OpenAI chat completions' logprobs object for the generated tokens' `entries`."""
    content = [{**_chat_token(e), "top_logprobs": [_chat_token(t) for t in e["top_logprobs"]]} for e in entries]
    return {"content": content, "refusal": None}
