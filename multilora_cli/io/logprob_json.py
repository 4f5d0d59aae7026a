"""Logprob entries -> the JSON text of each format's shapes: the bytes `json.dumps(..., ensure_ascii=False)` writes
for the plain values of io/logprob_records.py, without building them.

Why: at k 5 a generated token's entry was 7 small dicts; making and encoding them cost ~5-20 us a token on the
thread that runs the engine's steps (benchmarks/bench_records.py). Here the Python work is one pass over a line's
entries; per top token there is none (C-level map / zip / join):
- a token id's fragments (its text escaped by json.dumps, the simple and chat object heads, its UTF-8 bytes) are
  made once per run, when a shape first needs them, and cached by id (`TokenJson`); a line's ids are looked up with map(dict.__getitem__) and its
  texts checked against the cached ones with one list comparison (an id with another text is escaped anew);
- all of a line's logprobs are written in one call and split (`numbers`): by orjson when it is installed (~0.1 us a
  number against ~0.5 for repr; its text turned into repr's where they differ: exponents padded to two digits,
  values under 1e-4 in exponent form), else by json.dumps of the flat list (json's own float formatting: repr,
  Infinity / -Infinity / NaN, null);
- the text is the fragments, numbers and the separators between them (cached per k), joined once.
OpenAI completions' top_logprobs is a dict {token: logprob}: two top ids with one text (byte tokens that each read
U+FFFD) keep the first one's place and the last one's value: a line holding an id whose text another id has too
builds its dicts, keyed by the escaped text (one-to-one with the text).
tests/io/test_logprob_json.py compares every shape with json.dumps of the plain values on random entries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import accumulate, chain
from operator import add, itemgetter

from multilora_cli.io import logprob_records
from multilora_cli.io.logprob_records import Entry

try:
    import orjson
except ImportError:  # (a dependency; without it the numbers go through json.dumps, the same text, slower)
    orjson = None

_EXPONENT = re.compile(r"e([+-])(\d)(?!\d)")  # orjson's e-7 is repr's e-07
_SMALL = re.compile(r"0\.0000(0*)([1-9])(\d*)")  # orjson's 0.00001 is repr's 1e-05 (repr: exponent below 1e-4)


def _exponent_form(m: re.Match) -> str:
    if m.string[m.start() - 1] in "0123456789":  # inside a number (9350.00009...): not a leading 0.
        return m.group(0)
    zeros, digit, rest = m.groups()
    e = 5 + len(zeros)
    return f"{digit}.{rest}e-{e:02d}" if rest else f"{digit}e-{e:02d}"


def numbers_json(values: tuple) -> list[str]:
    """Each value's JSON text as json.dumps writes it (None as null; floats by repr, non-finite as json's)."""
    return json.dumps(values)[1:-1].split(", ")  # no number's text holds ", "


def numbers_orjson(values: tuple) -> list[str]:
    """numbers_json's texts, from orjson's: the same shortest digits, the layout made repr's. orjson writes
    inf / nan as null: a line holding one goes through json."""
    try:
        s = orjson.dumps(values).decode()
    except TypeError:  # (orjson.JSONEncodeError) a value orjson does not take (an int past 64 bits, ...)
        return numbers_json(values)
    if "null" in s and s.count("null") != values.count(None):
        return numbers_json(values)
    if "e" in s:
        s = _EXPONENT.sub(r"e\g<1>0\2", s)
    if "0.0000" in s:
        s = _SMALL.sub(_exponent_form, s)
    return s[1:-1].split(",")


numbers = numbers_json if orjson is None else numbers_orjson

_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
_HEAD = ', "top_logprobs": ['


def _seps(k: int) -> list[str]:
    """What follows each of an entry's k + 1 logprobs (its own, then its top ones) in the simple and chat shapes,
    the entries' ", " included."""
    return [_HEAD + "]}, "] if k == 0 else [_HEAD, *["}, "] * (k - 1), "}]}, "]


class _Fragments(dict):
    """token id -> one of its JSON fragments, made from its text the first time it is asked for (a run builds
    only the fragments of the shapes it writes)."""

    def __init__(self, texts: dict[int, str], make: Callable[[int, str], str | int]):
        super().__init__()
        self._texts, self._make = texts, make

    def __missing__(self, token_id: int) -> str | int:
        v = self[token_id] = self._make(token_id, self._texts[token_id])
        return v


def _string(token_id: int, text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class TokenJson:
    """Per-run cache of each token id's JSON fragments, and the writers of the three shapes from entries."""

    def __init__(self) -> None:
        self._text: dict[int, str] = {}  # id -> the text its fragments are made from
        t = self._text
        self._string = _Fragments(t, _string)  # id -> "text" (json.dumps of it)
        self._key = _Fragments(t, lambda i, x: _string(i, x) + ": ")  # "text": (a key of completions' top dicts)
        self._simple = _Fragments(t, lambda i, x: f'{{"id": {int.__repr__(i)}, "token": {_string(i, x)}, "logprob": ')
        self._chat = _Fragments(t, lambda i, x: f'{{"token": {_string(i, x)}, "logprob": ')
        self._bytes = _Fragments(t, lambda i, x: f', "bytes": {json.dumps(list(x.encode("utf-8")))}')
        self._chars = _Fragments(t, lambda i, x: len(x))
        self._fragments = (self._string, self._key, self._simple, self._chat, self._bytes, self._chars)
        self._owner: dict[str, int] = {}  # text -> the first id seen with it
        self._shared: set[int] = set()  # ids whose text another id has too (completions' dict collapses them)
        self._seps: dict[int, list[str]] = {}

    def _add(self, token_id: int, text: str) -> None:
        if token_id in self._text:  # another text under a known id: its fragments are made anew
            for f in self._fragments:
                f.pop(token_id, None)
        self._text[token_id] = text
        owner = self._owner.setdefault(text, token_id)
        if owner != token_id:
            self._shared.update((owner, token_id))

    def _flat(self, entries: list[Entry]) -> tuple[list[int], list[str], list[int]] | None:
        """(ids, logprobs' JSON texts, k per entry) over every entry's own token then its top tokens, the ids'
        fragments cached; None when the texts disagree within the line (one id, two texts)."""
        flat: list[tuple] = []
        ks: list[int] = []
        for e in entries:
            flat.append((e.id, e.token, e.logprob))
            flat += e.top
            ks.append(len(e.top))
        ids, texts = list(map(_first, flat)), list(map(_second, flat))  # (faster than zip(*flat))
        values = tuple(map(_third, flat))
        if list(map(self._text.get, ids)) != texts:
            for i, t in zip(ids, texts):
                known = self._text.get(i)
                if known is not t and known != t:
                    self._add(i, t)
            if list(map(self._text.get, ids)) != list(texts):
                return None
        return ids, numbers(values), ks

    def _sep_list(self, ks: list[int]) -> list[str]:
        seps: list[str] = []
        table = self._seps
        for k in ks:
            s = table.get(k)
            if s is None:
                s = table[k] = _seps(k)
            seps += s
        seps[-1] = seps[-1][:-2]  # the last entry: no ", " after it
        return seps

    # -- simple format: [{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}]}] --------------
    def simple(self, entries: list[Entry]) -> str:
        """The simple format's "logprobs" value."""
        if not entries:
            return "[]"
        flat = self._flat(entries)
        if flat is None:
            return json.dumps(logprob_records.simple(entries), ensure_ascii=False)
        ids, nums, ks = flat
        parts = zip(map(self._simple.__getitem__, ids), nums, self._sep_list(ks))
        return "".join(chain("[", chain.from_iterable(parts), "]"))  # (one copy of a line's text, not three)

    def simple_prompt(self, entries: list[Entry]) -> str:
        """The simple format's "prompt_logprobs": null for the first prompt token, then its entries."""
        rest = self.simple(entries[1:])
        return "[null]" if rest == "[]" else "[null, " + rest[1:]

    # -- OpenAI /v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal"} ------
    def chat(self, entries: list[Entry]) -> str:
        if not entries:
            return '{"content": [], "refusal": null}'
        flat = self._flat(entries)
        if flat is None:
            return json.dumps(logprob_records.chat(entries), ensure_ascii=False)
        ids, nums, ks = flat
        parts = zip(map(self._chat.__getitem__, ids), nums, map(self._bytes.__getitem__, ids), self._sep_list(ks))
        return "".join(chain(('{"content": [',), chain.from_iterable(parts), ('], "refusal": null}',)))

    # -- OpenAI /v1/completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} ---------------------
    def legacy(self, entries: list[Entry], text_offset: int) -> str:
        if not entries:
            return '{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}'
        flat = self._flat(entries)
        if flat is None:
            return json.dumps(logprob_records.legacy(entries, text_offset), ensure_ascii=False)
        ids, nums, ks = flat
        n, k = len(entries), ks[0]
        if ks.count(k) == n and "null" not in nums[:: k + 1] and self._shared.isdisjoint(ids):
            # every entry has k top tokens, a logprob, and no two top texts alike (the common line): sliced
            own, lps, tops = ids[:: k + 1], nums[:: k + 1], self._uniform_tops(ids, nums, n, k)
        else:
            own, lps, tops = self._tops(entries, ids, nums, ks)
        offsets = accumulate(map(self._chars.__getitem__, own[:-1]), initial=text_offset)
        return (
            f'{{"tokens": [{", ".join(map(self._string.__getitem__, own))}], "token_logprobs": [{", ".join(lps)}], '
            f'"top_logprobs": [{tops}], "text_offset": [{", ".join(map(str, offsets))}]}}'
        )

    def _uniform_tops(self, ids: list[int], nums: list[str], n: int, k: int) -> str:
        """completions' top_logprobs items ({"text": logprob, ...} per entry) for n entries of k top tokens each."""
        if k == 0:
            return ", ".join(["{}"] * n)
        pairs = list(map(add, map(self._key.__getitem__, ids), nums))  # '"text": logprob' per token
        pairs[:: k + 1] = [""] * n  # an entry's own token has no pair there
        leads = ["}, {", "", *[", "] * (k - 1)] * n  # what comes before each token's pair
        leads[0] = "{"
        return "".join(chain(chain.from_iterable(zip(leads, pairs)), "}"))

    def _tops(self, entries: list[Entry], ids: list[int], nums: list[str], ks: list[int]) -> tuple:
        """(own ids, own logprob texts, top_logprobs items) entry by entry: any k, null logprobs, shared texts."""
        starts = list(accumulate(map((1).__add__, ks[:-1]), initial=0))  # each entry's own token in the flat lists
        pairs = list(map(add, map(self._key.__getitem__, ids), nums))
        unique = self._shared.isdisjoint(ids)
        tops = []
        for e, at, k in zip(entries, starts, ks):
            if e.logprob is None:
                tops.append("null")
            elif unique or self._shared.isdisjoint(ids[at + 1 : at + 1 + k]):
                tops.append("{" + ", ".join(pairs[at + 1 : at + 1 + k]) + "}")
            else:  # keyed by the escaped text (one-to-one with the text): the first one's place, the last one's value
                d = dict(zip(map(self._key.__getitem__, ids[at + 1 : at + 1 + k]), nums[at + 1 : at + 1 + k]))
                tops.append("{" + ", ".join(map(add, d, d.values())) + "}")
        return list(map(ids.__getitem__, starts)), list(map(nums.__getitem__, starts)), ", ".join(tops)
