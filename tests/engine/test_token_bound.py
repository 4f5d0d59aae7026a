"""token_bound: prompts that provably exceed max_model_len are refused before they are encoded.

The bound must be a true lower bound on the token count (a prompt that fits is never refused), so it is checked
against real encodings: every vocabulary token's text of the demo tokenizer, long runs of its longest tokens,
and a SentencePiece-style byte-fallback tokenizer; tokenizers where one token can cover any length of text (unk
fusing, dropped characters, lstrip, shrinking normalizers, truncation) get no bound at all.
"""

from __future__ import annotations

import json

import pytest

from multilora_cli.engine.request import Request
from multilora_cli.engine.token_bound import analyze, byte_level_alphabet
from multilora_cli.engine.tokenizer import Tokenizer
from multilora_cli.errors import RequestError
from tests.builders import build_tokenizer
from tests.engine.engine_tok import TEXT, write_chatml_dir, write_llama3_dir

LIMIT = 512  # the demo's max_position_embeddings


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """The tokenizer `multilora demo` ships: the same corpus, vocabulary size and writer (~0.2 s)."""
    from multilora_cli.demo import corpus, tokenizer
    from multilora_cli.demo.build import DemoSpec

    spec = DemoSpec()
    lines = [s for d in corpus.DOMAINS for s in corpus.plain_lines(d, spec.lines_per_domain, spec.seed)]
    lines += [s for d in corpus.DOMAINS for qa in corpus.chat_pairs(d, spec.chats_per_domain, spec.seed) for s in qa]
    out = tmp_path_factory.mktemp("demo_tok")
    tokenizer.write_tokenizer(tokenizer.train_tokenizer(lines, spec.vocab_size), out, LIMIT)
    return out


class CountingBackend:
    """The real `tokenizers.Tokenizer`, recording the length of every text it is asked to encode."""

    def __init__(self, real):
        self.real = real
        self.encoded: list[int] = []

    def encode(self, text, *args, **kwargs):
        self.encoded.append(len(text))
        return self.real.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


def counting(path) -> tuple[Tokenizer, CountingBackend]:
    tok = Tokenizer.from_dir(path)
    tok.backend = CountingBackend(tok.backend)
    return tok, tok.backend


def assert_bound_holds(tok: Tokenizer, texts) -> None:
    """Every text has at least ceil(bytes / max_token_bytes) tokens; on a byte-level vocabulary each token's
    symbols are one byte each, they add up to the text's bytes, and no token has more than the bound."""
    mtb = tok.token_bound.max_token_bytes
    alphabet = byte_level_alphabet()
    specials = {t.content for t in tok.backend.get_added_tokens_decoder().values()}
    for text in texts:
        enc = tok.backend.encode(text, add_special_tokens=False)
        nbytes = len(text.encode())
        assert len(enc.ids) * mtb >= nbytes, (text[:60], len(enc.ids), nbytes)
        if tok.token_bound.max_token_bytes and all(c in alphabet for t in enc.tokens if t not in specials for c in t):
            sizes = [len(t.encode()) if t in specials else len(t) for t in enc.tokens]
            assert sum(sizes) == nbytes and max(sizes, default=0) <= mtb, text[:60]


def test_byte_level_alphabet_is_gpt2s():
    from tokenizers.pre_tokenizers import ByteLevel

    table = byte_level_alphabet()
    assert set(table) == set(ByteLevel.alphabet()) and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["a"] == ord("a")


def test_demo_bound_is_the_longest_token_and_holds_for_every_vocabulary_text(demo_dir):
    tok = Tokenizer.from_dir(demo_dir)
    bound = tok.token_bound
    assert bound.nf_form is None and bound.reason == ""
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    texts = [tok.decode([i], skip_special_tokens=False) for i in sorted(vocab.values())]
    longest = max(texts, key=lambda t: len(t.encode()))
    assert bound.max_token_bytes == len(longest.encode()) == len("<|start_header_id|>")
    # the bound is tight: a run of the longest token is exactly ceil(bytes / bound) tokens
    assert len(tok.encode(longest * 50, add_special_tokens=False)) == 50
    model_longest = max(
        (t for t in texts if t not in ("<|start_header_id|>", "<|end_header_id|>")), key=lambda t: len(t.encode())
    )
    assert_bound_holds(
        tok,
        texts
        + [
            "".join(texts),
            " ".join(texts),
            model_longest * 200,
            " " * 5000,
            "\n" * 3000,
            *TEXT,
            "".join(TEXT) * 20,
            "é東🌍" * 500,
        ],
    )


def test_byte_fallback_tokenizer_gets_a_bound_that_holds(tmp_path):
    """Llama-2 / Mistral-v0.1 style: "▁" for spaces by the normalizer, BPE with <0xNN> byte fallback, fuse_unk."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, normalizers

    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "▁▁", "▁▁▁▁", "▁▁▁▁▁▁▁▁"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    vocab.update({p: len(vocab) + i for i, p in enumerate(pieces)})
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "▁"), ("▁▁", "▁▁"), ("▁▁▁▁", "▁▁▁▁")]
    backend = Backend(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok = Tokenizer(backend)
    assert tok.token_bound.max_token_bytes == len("▁▁▁▁▁▁▁▁".encode()) == 24
    assert_bound_holds(tok, ["the theme", " " * 4000, "x" * 999, "東京 🌍 ça" * 300, "<0x41>" * 100, *TEXT])
    backend.model = models.BPE(
        {k: v for k, v in vocab.items() if k != "<0x7F>"}, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True
    )
    assert tok.token_bound.max_token_bytes == 24  # cached once per tokenizer
    assert Tokenizer(backend).token_bound.max_token_bytes is None  # one byte missing: unk runs may fuse


def _llama3_json(root) -> dict:
    return json.loads((write_llama3_dir(root / "l3") / "tokenizer.json").read_text())


@pytest.mark.parametrize(
    "patch, reason",
    [
        (lambda d: d["added_tokens"][0].update(lstrip=True), "lstrip"),
        (lambda d: d.update(pre_tokenizer={"type": "WhitespaceSplit"}), "drops"),
        (
            lambda d: d.update(
                pre_tokenizer={"type": "Split", "pattern": {"String": "x"}, "behavior": "Removed", "invert": False}
            ),
            "drop",
        ),
        (lambda d: d.update(normalizer={"type": "Lowercase"}), "shrink"),
        (lambda d: d.update(normalizer={"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}), "shrink"),
        (
            lambda d: d.update(
                normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "NFKC"}]}
            ),
            "shrink",
        ),
        (lambda d: d.update(truncation={"max_length": 8}), "truncation"),
        (lambda d: d["model"].update(type="WordPiece"), "BPE"),
        (lambda d: d["model"]["vocab"].pop("Ġ"), "dropped"),
        (lambda d: d["model"].update(continuing_subword_prefix="##"), "dropped"),
        (
            lambda d: (d["model"]["vocab"].pop("Ġ"), d["model"].update(unk_token="<|end_of_text|>", fuse_unk=True)),
            "fuse",
        ),
    ],
)
def test_no_bound_where_one_token_may_cover_any_length(tmp_path, patch, reason):
    d = _llama3_json(tmp_path)
    assert analyze(d).max_token_bytes is not None
    patch(d)
    bound = analyze(d)
    assert bound.max_token_bytes is None and reason in bound.reason
    assert bound.min_tokens("a" * 10**6, 8) is None


def test_unknowns_dropped_or_worded_get_no_bound(tmp_path):
    """Why: without an unk token BPE drops unknown characters (8,000 bytes -> 1 token), and a word-level unk
    covers any word."""
    tok = Tokenizer.from_dir(write_chatml_dir(tmp_path / "meta", metaspace=True))
    assert tok.token_bound.max_token_bytes is None
    assert len(tok.encode("ж" * 4000)) <= 1
    assert Tokenizer.from_dir(build_tokenizer(tmp_path / "words")).token_bound.max_token_bytes is None


def test_unk_per_character_counts_four_bytes(tmp_path):
    d = _llama3_json(tmp_path)
    d["model"]["vocab"].pop("Ġ")
    d["model"].update(unk_token="<|end_of_text|>", fuse_unk=False)
    assert analyze(d).max_token_bytes == len("<|start_header_id|>")  # 1 byte per unk symbol: below the specials
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    d["added_tokens"] = []
    d["model"].update(vocab={"a": 0, "b": 1}, unk_token="a")
    assert analyze(d).max_token_bytes == 4  # not byte-level: an unk is one character, up to 4 bytes


def test_nfc_normalizer_bounds_only_normalized_text(tmp_path):
    d = _llama3_json(tmp_path)
    d["normalizer"] = {"type": "NFC"}  # Qwen2 / Qwen3
    bound = analyze(d)
    mtb = bound.max_token_bytes
    assert bound.nf_form == "NFC" and mtb == len("<|start_header_id|>")
    assert bound.min_tokens("a" * (8 * mtb + 1), 8) == (8 * mtb + 1, 9)
    assert bound.min_tokens("\u212a" * (8 * mtb), 8) is None  # Kelvin signs: NFC makes each 3 bytes 1 byte
    from tokenizers import Tokenizer as Backend

    tok = Tokenizer(Backend.from_str(json.dumps(d)))
    assert tok.token_bound == bound
    assert_bound_holds(tok, ["é東🌍 ça" * 300, "<|eot_id|>\u0301" * 200, *TEXT])
    kelvin = tok.backend.encode("\u212a" * 3000, add_special_tokens=False).tokens
    assert sum(map(len, kelvin)) == 3000  # 9,000 bytes of text but 3,000 after NFC: why it must be NFC already


def test_prompt_over_the_bound_is_refused_without_encoding(demo_dir):
    tok, backend = counting(demo_dir)
    mtb = tok.token_bound.max_token_bytes
    for req in (
        Request(key=0, id="big", prompt="a" * (LIMIT * mtb + 1)),
        Request(key=1, id="big", prompt="the court held " * 400_000),  # 6 MB
        Request(key=2, id="big", messages=[{"role": "user", "content": "é" * (LIMIT * mtb // 2)}]),
    ):
        with pytest.raises(RequestError) as e:
            tok.encode_request(req, LIMIT)
        assert e.value.code == "prompt_too_long"
        line = e.value.one_line()
        assert line.startswith("request big: prompt is too long: its ") and f"max_model_len is {LIMIT}" in line
        assert "shorten the prompt, or raise --max-model-len" in line
    assert backend.encoded == []
    assert "its 9,729 bytes are at least 513 tokens (no token covers more than 19 bytes)" in str(
        pytest.raises(RequestError, tok.encode_request, Request(key=3, id="x", prompt="a" * 9729), LIMIT).value
    )


def test_prompt_under_the_bound_is_encoded_as_before(demo_dir):
    tok, backend = counting(demo_dir)
    short = Request(key=0, id="s", prompt="The court held that")
    assert tok.encode_request(short, LIMIT) == tok.encode(short.prompt)
    assert tok._bound is None  # a short prompt never pays for the vocabulary pass
    mtb = tok.token_bound.max_token_bytes
    at = Request(key=1, id="at", prompt="a" * (LIMIT * mtb))  # may fit as far as bytes tell: counted exactly
    backend.encoded.clear()
    assert tok.encode_request(at, LIMIT) == tok.encode(at.prompt)
    assert backend.encoded == [LIMIT * mtb] * 2
    chat = Request(key=2, id="c", messages=[{"role": "user", "content": "b" * (LIMIT * mtb - 200)}])
    assert tok.encode_request(chat, LIMIT) == tok.apply_chat_template(chat.messages)
    huge = Request(key=3, id="h", prompt="a" * (LIMIT * mtb * 4))
    assert len(tok.encode_request(huge, None)) > LIMIT  # no limit: nothing to refuse
