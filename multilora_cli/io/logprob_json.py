"""Logprob entries -> the JSON text of each format's shapes, as `json.dumps(..., ensure_ascii=False)` writes the
dicts of io/logprob_records.py, without building them.

Why: at k 5 a generated token's entry is 7 small dicts; making them and encoding them cost ~6 us a token on the
thread that runs the engine's steps (benchmarks/bench_records.py). Here a token id's text is escaped once per
run (`TokenJson` caches each id's fragments) and an entry is a few string concatenations.

Byte-identical to json.dumps by construction: strings are escaped by json.dumps itself (once, cached), floats
written with float.__repr__ (json's own formatting; inf / -inf / nan as Infinity / -Infinity / NaN), ints with
int.__repr__, None as null, separators ", " and ": ". OpenAI completions' top_logprobs is a dict
{token: logprob}: two top ids with the same text keep the first one's position and the last one's value, as the
dict does (the fragment dict below is keyed by the escaped text, and escaping is one-to-one).
tests/io/test_logprob_json.py compares both on random entries.
"""

from __future__ import annotations

import json
from typing import Protocol

_repr = float.__repr__
_SPECIAL = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}


class Entry(Protocol):
    """One token's logprob entry (engine/request.TokenLogprob has this shape): `top` is (id, text, logprob) for
    the k most likely tokens, most likely first; `logprob` None for a prompt's first token."""

    id: int
    token: str
    logprob: float | None
    top: list[tuple[int, str, float]]


def num(v) -> str:
    """A logprob as json.dumps writes it."""
    if v.__class__ is float:
        s = _repr(v)
        return _SPECIAL.get(s, s) if s[-1] in "fn" else s
    return json.dumps(v)  # None, an int (or anything else: as json does, TypeError included)


class _Frags:
    """One token id's JSON fragments (its text escaped once)."""

    __slots__ = ("text", "string", "simple", "chat", "bytes", "chars")

    def __init__(self, token_id: int, text: str):
        self.text = text
        self.string = json.dumps(text, ensure_ascii=False)  # "text" (also a dict key)
        self.simple = f'{{"id": {int.__repr__(token_id)}, "token": {self.string}, "logprob": '
        self.chat = f'{{"token": {self.string}, "logprob": '
        self.bytes = f', "bytes": {json.dumps(list(text.encode("utf-8")))}'
        self.chars = len(text)


class TokenJson:
    """Per-run cache of each token id's JSON fragments and the writers of the three shapes from entries.

    Keyed by id; a hit is used only when its text is the entry's (the same string object, or equal), so a
    cache shared by callers with other texts for an id stays correct (it re-escapes)."""

    def __init__(self) -> None:
        self._by_id: dict[int, _Frags] = {}

    def _frags(self, token_id: int, text: str) -> _Frags:
        f = self._by_id.get(token_id)
        if f is None or (f.text is not text and f.text != text):
            f = self._by_id[token_id] = _Frags(token_id, text)
        return f

    # -- simple format: [{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}]}] --------------
    def simple_entry(self, e: Entry) -> str:
        frags = self._frags
        top = ", ".join([frags(i, s).simple + num(v) + "}" for i, s, v in e.top])
        return f'{frags(e.id, e.token).simple}{num(e.logprob)}, "top_logprobs": [{top}]}}'

    def simple(self, entries: list[Entry]) -> str:
        """The simple format's "logprobs" value."""
        return "[" + ", ".join([self.simple_entry(e) for e in entries]) + "]"

    def simple_prompt(self, entries: list[Entry]) -> str:
        """The simple format's "prompt_logprobs": null for the first prompt token, then its entries."""
        return "[" + ", ".join(["null", *[self.simple_entry(e) for e in entries[1:]]]) + "]"

    # -- OpenAI /v1/completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} ---------------------
    def legacy(self, entries: list[Entry], text_offset: int) -> str:
        frags = self._frags
        tokens, lps, tops, offsets = [], [], [], []
        at = text_offset
        for e in entries:
            f = frags(e.id, e.token)
            tokens.append(f.string)
            lps.append(num(e.logprob))
            if e.logprob is None:
                tops.append("null")
            else:
                d = {frags(i, s).string: v for i, s, v in e.top}  # duplicate texts collapse as the dict's do
                tops.append("{" + ", ".join([f"{k}: {num(v)}" for k, v in d.items()]) + "}")
            offsets.append(int.__repr__(at))
            at += f.chars
        return (
            f'{{"tokens": [{", ".join(tokens)}], "token_logprobs": [{", ".join(lps)}], '
            f'"top_logprobs": [{", ".join(tops)}], "text_offset": [{", ".join(offsets)}]}}'
        )

    # -- OpenAI /v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal"} ------
    def chat(self, entries: list[Entry]) -> str:
        frags = self._frags
        out = []
        for e in entries:
            top = []
            for i, s, v in e.top:
                f = frags(i, s)
                top.append(f.chat + num(v) + f.bytes + "}")
            f = frags(e.id, e.token)
            out.append(f'{f.chat}{num(e.logprob)}{f.bytes}, "top_logprobs": [{", ".join(top)}]}}')
        return f'{{"content": [{", ".join(out)}], "refusal": null}}'
