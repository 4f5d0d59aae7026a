"""A lower bound on a prompt's token count from its UTF-8 length alone, to refuse huge prompts before encoding.

Encoding a 5 MB prompt with HF `tokenizers` takes seconds and ~2 GB (the Encoding keeps ids, offsets, token
strings and masks per token), only for the scheduler to refuse it as longer than max_model_len. If no token can
cover more than `max_token_bytes` bytes of the text, a text of B bytes has at least ceil(B / max_token_bytes)
tokens, and one of more than max_model_len * max_token_bytes bytes can never fit: it is refused unencoded.

The bound must never refuse a prompt that would fit, so `analyze` reads tokenizer.json and gives a bound only
where every step from text to ids provably keeps "bytes <= tokens * max_token_bytes":
- added (special) tokens are matched in the text as written and cover their content's bytes; one with lstrip /
  rstrip also swallows the whitespace beside it, of any length: no bound.
- the normalizer must not shrink the text: none, Prepend, Replace of a literal by something as long or longer.
  NFC / NFKC / NFD / NFKD (Qwen's NFC) can shrink it (the Kelvin sign, 3 bytes, becomes "K"), so the bound is
  used only for a text already in that form, which the normalizer leaves as it is (`TokenBound.applies`).
- the pre-tokenizer must not drop text (Whitespace, WhitespaceSplit, BertPreTokenizer, a "Removed" split do).
- the model (BPE only) must not drop unknown characters (no unk_token) or fuse a run of them into one unk
  (fuse_unk): byte-level vocabularies hold all 256 byte symbols and byte_fallback ones all 256 <0xNN> tokens, so
  every character is covered by real tokens; otherwise an unk covers one symbol: a byte, or a character (<= 4).
- truncation would cap the count: no bound (Tokenizer.from_dir turns it off).
Templates and post-processors only add text and tokens (BOS, headers), so tokens of the rendered text stay
>= its bytes / max_token_bytes.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass

NF_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
DROPPING_PRE_TOKENIZERS = ("Whitespace", "WhitespaceSplit", "BertPreTokenizer", "CharDelimiterSplit")
KEEPING_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Split", "Punctuation", "Digits")
UTF8_MAX = 4  # bytes of one character: what one unk covers when it stands for a single character
# what to do about a prompt_too_long, refused here or by the scheduler's exact count (Scheduler.add)
PROMPT_TOO_LONG_HINT = "shorten the prompt, or raise --max-model-len up to the model's max_position_embeddings"


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte -> printable character map (bytes_to_unicode), inverted: the symbols byte-level BPE
    vocabularies are written in; each stands for exactly ONE byte of the text (2 bytes of UTF-8 for most)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[chr(b)] = b
        else:
            out[chr(256 + extra)] = b
            extra += 1
    return out


@dataclass(slots=True, frozen=True)
class TokenBound:
    """`max_token_bytes`: most bytes of text one token covers (None: no provable bound, see `reason`).
    `nf_form`: the normalizer's Unicode form, if any: the bound holds for texts already in that form."""

    max_token_bytes: int | None
    nf_form: str | None = None
    reason: str = ""

    def applies(self, text: str) -> bool:
        """The bound holds for `text`. An NF normalizer leaves a text already in its form as it is, and so every
        piece of it between added tokens (a substring of a normalized text is normalized). Python's Unicode
        tables are newer than those of tokenizers' normalizer, and a normalized text stays normalized under
        later versions (Unicode's stability policy), never the other way round."""
        return self.max_token_bytes is not None and (
            self.nf_form is None or unicodedata.is_normalized(self.nf_form, text)
        )

    def min_tokens(self, text: str, max_model_len: int) -> tuple[int, int] | None:
        """(bytes, fewest tokens) of a text that provably has more than `max_model_len` tokens, else None.
        Cheap: no encoding, and the UTF-8 length is taken only when the character count cannot settle it."""
        mtb = self.max_token_bytes
        limit = max_model_len * mtb if mtb is not None else None
        if limit is None or len(text) * UTF8_MAX <= limit:  # a character is 1-4 bytes
            return None
        nbytes = len(text.encode("utf-8", "surrogatepass"))
        if nbytes <= limit or not self.applies(text):
            return None
        return nbytes, -(-nbytes // mtb)


def _normalizer(node: dict | None, first: bool = True) -> tuple[bool, str | None, str]:
    """(never shrinks the text?, its NF form, why not)."""
    if node is None:
        return True, None, ""
    kind = node.get("type")
    if kind == "Prepend":
        return True, None, ""
    if kind == "Replace":
        pattern = node.get("pattern") or {}
        if "String" in pattern and len(node.get("content", "").encode()) >= len(pattern["String"].encode()):
            return True, None, ""
        return False, None, "a Replace normalizer that may shrink the text"
    if kind in NF_FORMS and first:  # first: it sees the raw text, so `applies` can check the raw text
        return True, kind, ""
    if kind == "Sequence":
        form = None
        for i, child in enumerate(node.get("normalizers") or []):
            ok, f, why = _normalizer(child, first=first and i == 0)
            if not ok:
                return False, None, why
            form = form or f
        return True, form, ""
    return False, None, f"the {kind} normalizer may shrink the text"


def _pre_tokenizer(node: dict | None) -> tuple[bool, bool, str]:
    """(keeps every byte?, byte-level?, why not)."""
    if node is None:
        return True, False, ""
    kind = node.get("type")
    if kind == "Sequence":
        byte_level = False
        for child in node.get("pretokenizers") or []:
            ok, bl, why = _pre_tokenizer(child)
            if not ok:
                return False, False, why
            byte_level = byte_level or bl
        return True, byte_level, ""
    if kind in KEEPING_PRE_TOKENIZERS and node.get("behavior") != "Removed":
        return True, kind == "ByteLevel", ""
    return False, False, f"the {kind} pre-tokenizer {'drops' if kind in DROPPING_PRE_TOKENIZERS else 'may drop'} text"


def analyze(tokenizer_json: str | dict) -> TokenBound:
    """The bound of one tokenizer (tokenizer.json's text or its parsed dict); see the module docstring."""
    d = json.loads(tokenizer_json) if isinstance(tokenizer_json, str) else tokenizer_json
    model = d.get("model") or {}
    if d.get("truncation"):
        return TokenBound(None, reason="truncation caps the token count")
    if model.get("type") != "BPE":
        return TokenBound(None, reason=f"a {model.get('type')} model (only BPE is analyzed)")
    keeps, form, why = _normalizer(d.get("normalizer"))
    if not keeps:
        return TokenBound(None, reason=why)
    keeps, byte_level, why = _pre_tokenizer(d.get("pre_tokenizer"))
    if not keeps:
        return TokenBound(None, reason=why)
    added = d.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return TokenBound(None, reason="an added token with lstrip / rstrip covers any run of whitespace")
    vocab = model.get("vocab") or {}
    alphabet = byte_level_alphabet()
    if byte_level:
        # a symbol stands for one byte; anything else in an entry (a "##" prefix, a stray character) can never
        # match byte-level text: counting its UTF-8 bytes only overestimates
        sizes = [sum(1 if c in alphabet else len(c.encode()) for c in tok) for tok in vocab]
        complete = all(c in vocab for c in alphabet)
    else:
        # entries are text as the pre-tokenizer leaves it ("▁" for a space: 3 bytes for 1, an overestimate;
        # "<0x41>": 6 for 1)
        sizes = [len(tok.encode("utf-8", "surrogatepass")) for tok in vocab]
        complete = bool(model.get("byte_fallback")) and all(f"<0x{b:02X}>" in vocab for b in range(256))
    sizes += [len(t.get("content", "").encode("utf-8", "surrogatepass")) for t in added]
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        complete = False  # a symbol may be in the vocabulary only without its "##" / "</w>"
    if not complete:  # some character may be unknown to the vocabulary
        if model.get("unk_token") is None:
            return TokenBound(None, reason="unknown characters are dropped (no unk_token)")
        if model.get("fuse_unk"):
            return TokenBound(None, reason="fuse_unk makes one unk of any run of unknown characters")
        sizes.append(1 if byte_level else UTF8_MAX)
    return TokenBound(max(sizes, default=0) or None, nf_form=form, reason="" if sizes else "an empty vocabulary")
