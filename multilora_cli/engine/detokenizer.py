"""Output ids -> text, and the decision to stop a sequence (eos, stop_token_ids, stop strings, max_tokens,
max_model_len; none but the lengths before min_tokens tokens, as vLLM).

`IncrementalDecoder` turns a growing list of ids into text a token at a time without decoding the whole
output each step: it decodes a short window (from `prefix_offset`) and emits the part past the previously
emitted window, holding text back while it ends in U+FFFD (a multi-byte UTF-8 character split across tokens).
Decoding a window rather than a single token keeps decoders that drop a leading space at the start of a decode
(SentencePiece's metaspace) consistent with decoding everything at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from multilora_cli.engine.sequence import Sequence

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Accumulates `text` = decode(ids so far), emitted only up to the last complete character."""

    __slots__ = ("tokenizer", "skip_special_tokens", "ids", "prefix_offset", "read_offset", "text")

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # ids before this are reflected in `text`
        self.text = ""

    def push(self, token_ids: Iterable[int]) -> str:
        """Append ids; return the text they complete (may be "" while a character is split)."""
        self.ids.extend(token_ids)
        dec = self.tokenizer.decode
        prefix = dec(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip_special_tokens)
        full = dec(self.ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            new = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += new
            return new
        return ""


def find_stop(text: str, stops: list[str], new_from: int) -> int:
    """Earliest index of any stop string in `text` that ends past `new_from` (older text was already checked);
    -1 if none."""
    best = -1
    for s in stops:
        i = text.find(s, max(0, new_from - len(s) + 1))
        if i >= 0 and (best < 0 or i < best):
            best = i
    return best


class StopChecker:
    """Callable passed to `Scheduler.postprocess`: after a token is appended, returns "stop" / "length" / None
    and, when the sequence finishes, sets `seq.text` (truncated before a stop string; eos and the stop_token_ids
    not included, though counted as generated tokens). Before `min_tokens` generated tokens only the lengths
    stop a sequence (the sampler bans eos and stop_token_ids until then; stop strings are not matched, as in
    vLLM: one that ends at or after the min_tokens-th token is)."""

    def __init__(self, tokenizer=None, eos_token_ids: Iterable[int] = (), max_model_len: int | None = None):
        self.tokenizer = tokenizer
        self.eos = frozenset(eos_token_ids)
        self.max_model_len = max_model_len

    def __call__(self, seq: Sequence) -> str | None:
        # once per sampled token: fields read directly, not through Sequence's properties (~4 calls a token)
        sp = seq.request.sampling
        ids = seq.token_ids
        tok = ids[-1]
        if sp.min_tokens and len(ids) - len(seq.prompt_token_ids) < sp.min_tokens:
            return self._length(seq, sp)
        if (not sp.ignore_eos and tok in self.eos) or tok in sp.stop_token_ids:
            self._set_text(seq, seq.output_token_ids[:-1])
            return "stop"
        if sp.stop and self.tokenizer is not None:
            if seq.detok is None:
                seq.detok = IncrementalDecoder(self.tokenizer)
                seq.detok.push(seq.output_token_ids[:-1])
            det = seq.detok
            before = len(det.text)
            det.push([tok])
            if len(det.text) > before and (i := find_stop(det.text, sp.stop, before)) >= 0:
                seq.text = det.text[:i]
                return "stop"
        return self._length(seq, sp)

    def _length(self, seq: Sequence, sp) -> str | None:
        n = len(seq.token_ids)
        if n - len(seq.prompt_token_ids) >= sp.max_tokens or (
            self.max_model_len is not None and n >= self.max_model_len
        ):
            self._set_text(seq, seq.output_token_ids)
            return "length"
        return None

    def stopped_by_token(self, seq: Sequence) -> bool:
        """Whether finished `seq` stopped on a token that ends it (eos unless ignore_eos, a stop_token_id): that
        token is its last, counted in usage but in neither its text nor its result's token ids."""
        sp = seq.request.sampling
        if seq.finish_reason != "stop" or seq.num_completion_tokens == 0:
            return False
        tok = seq.token_ids[-1]
        return (not sp.ignore_eos and tok in self.eos) or tok in sp.stop_token_ids

    def _set_text(self, seq: Sequence, ids: list[int]) -> None:
        if self.tokenizer is not None:
            seq.text = self.tokenizer.decode(ids, skip_special_tokens=True)
