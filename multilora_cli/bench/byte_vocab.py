"""A synthetic byte-level BPE tokenizer of any vocabulary size, for benchmarks that need real text per token
(structured output: a grammar needs tokens that spell JSON), built in about a second with no training and no
download.

Ids 0, 1, 2 are <unk>, <s>, </s> (the presets' bos 1 and eos 2), then the 256 single bytes (GPT-2's byte-level
alphabet, so every text is encodable), then deterministic pseudo-random pieces up to `vocab_size`: lowercase
words with and without a leading space, digit runs, and JSON punctuation runs (`{"`, `":`, `,"`, `"}` ...), in
the proportions a code-and-text vocabulary like Llama-3's has roughly. There are no merges: encoding gives
single bytes (benchmarks feed token ids); decoding any id gives its piece.
"""

from __future__ import annotations

import random

SPECIALS = ("<unk>", "<s>", "</s>")
PUNCT = '{}[]":, ._-\n'


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what a ByteLevel pre-tokenizer and decoder use)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def pieces(count: int, seed: int = 0) -> list[str]:
    """`count` distinct text pieces (see the module docstring)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    out: dict[str, None] = {}
    while len(out) < count:
        kind = rng.random()
        if kind < 0.75:
            word = "".join(rng.choices(letters, weights, k=rng.randint(2, 9)))
            piece = (" " + word) if rng.random() < 0.5 else word
        elif kind < 0.85:
            piece = "".join(rng.choices("0123456789", k=rng.randint(1, 4)))
        else:
            piece = "".join(rng.choices(PUNCT, k=rng.randint(2, 4)))
        out[piece] = None
    return list(out)


def byte_level_tokenizer(vocab_size: int, seed: int = 0):
    """A `tokenizers.Tokenizer` (byte-level BPE, no merges) with exactly `vocab_size` ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    b2u = bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    for p in pieces(vocab_size * 2, seed):
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault("".join(b2u[b] for b in p.encode()), len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    return tok
