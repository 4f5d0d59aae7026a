"""`GrammarCompiler`: a request's Constraint -> a compiled llguidance matcher, once per distinct constraint.

Why llguidance (README "Structured output" has the numbers): it has no dependency of its own (xgrammar pulls in
torch, transformers and triton as requirements, which a CPU/GPU venv must then not let it up- or downgrade), it
reads a HF tokenizer.json as it is (byte-level BPE included), its masks need no per-schema precompute over the
vocabulary (a new schema compiles in about a millisecond; the mask is computed lazily per step, in Rust, for a
whole batch on its own thread pool with the GIL released), and it covers JSON Schema, regexes and Lark grammars.

The tokenizer info is built once from the model's `tokenizer.json` (engine/tokenizer.py's backend, added tokens
included) with the logits' width as the vocabulary (ids the tokenizer lacks are never allowed) and the engine's
eos ids. Compiling validates: a schema or regex llguidance refuses is a RequestError for that line only.
Each row gets `deep_copy()` of the cached template matcher (its own parser state; the grammar is shared).
"""

from __future__ import annotations

import json
import time

from multilora_cli.constraint import Constraint
from multilora_cli.errors import RequestError

# JSON without free whitespace between tokens (the default lets a model pad with newlines and tabs forever,
# which greedy decoding of a small model does); a schema's own "x-guidance" options still apply over these
JSON_OPTIONS = {"whitespace_flexible": False}


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices`: every character escaped as \\x{HEX} (Rust regex syntax), so
    no choice's text is read as regex syntax."""
    return "|".join("(" + "".join(f"\\x{{{ord(c):X}}}" for c in ch) + ")" for ch in choices)


def grammar_source(c: Constraint) -> str:
    """The llguidance grammar (its JSON form) of `c`. Raises ValueError for a schema that is not a JSON object."""
    import llguidance

    M = llguidance.LLMatcher
    if c.kind == "json_object":
        return M.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if c.kind == "json_schema":
        schema = json.loads(c.source)
        if schema is True:
            schema = {}
        return M.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if c.kind == "regex":
        return M.grammar_from_regex(c.source)
    return M.grammar_from_regex(choice_regex(json.loads(c.source)))


class GrammarCompiler:
    """Compiled matchers per Constraint for one tokenizer. Not thread-safe: the engine's admission calls it."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]):
        import llguidance

        if not eos_token_ids:
            raise RequestError("structured output needs the model's eos token id (none is configured)")
        self.vocab_size = vocab_size
        self.llt = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
        self._cache: dict[Constraint, object] = {}  # Constraint -> template LLMatcher (its initial state)
        self._errors: dict[Constraint, str] = {}  # Constraint -> why it does not compile (asked once)
        self.compile_seconds: dict[Constraint, float] = {}  # per distinct constraint (benchmarks report them)

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> GrammarCompiler:
        """From an engine/tokenizer.Tokenizer (its `tokenizers` backend). `vocab_size`: the logits' width; a
        tokenizer with more ids than that widens the mask (ids past the logits are never drawn)."""
        return cls(tokenizer.backend.to_str(), max(vocab_size, tokenizer.vocab_size), eos_token_ids)

    def check(self, c: Constraint, request_id: str = "") -> None:
        """Compile `c` (cached); raise RequestError(code="invalid_constraint") if it does not compile."""
        self.template(c, request_id)

    def template(self, c: Constraint, request_id: str = ""):
        """The cached matcher of `c` in its initial state (compiled on first use)."""
        m = self._cache.get(c)
        if m is not None:
            return m
        why = self._errors.get(c)
        if why is None:
            import llguidance

            t0 = time.perf_counter()
            try:
                m = llguidance.LLMatcher(self.llt, grammar_source(c), log_level=0)
                why = m.get_error() if m.is_error() else None
            except (ValueError, TypeError, RuntimeError) as e:  # grammar_from_* on a malformed schema
                why = str(e)
            self.compile_seconds[c] = time.perf_counter() - t0
            if why is None:
                self._cache[c] = m
                return m
            self._errors[c] = why
        who = f"request {request_id}: " if request_id else ""
        raise RequestError(
            f"{who}the {c.label} constraint does not compile: {why.strip().splitlines()[0] if why.strip() else why}",
            code="invalid_constraint",
        )

    def matcher(self, c: Constraint):
        """A fresh matcher for one row (its own parser state)."""
        return self.template(c).deep_copy()
