"""The grammar bitmask kernel (kernels/bitmask.py) against its torch definition and against the bit layout
llguidance writes (bit v % 32 of word v // 32): constrained rows picked out of order, a vocabulary that is not a
multiple of 32 nor of the block, fp32 / fp16 logits (the interpreter's bf16 is not trusted), other rows
untouched. Runs on CUDA where there is one, else under the interpreter."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.bitmask import apply_bitmask, apply_bitmask_torch, unpack_bitmask
from tests.devices import KERNEL_DEVICE as DEV


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """[C, V] bool -> [C, ceil(V / 32)] int32, bit v % 32 of word v // 32 (the padding bits set, as llguidance's)."""
    c, v = allowed.shape
    w = (v + 31) // 32
    bits = torch.ones(c, w * 32, dtype=torch.int64)
    bits[:, :v] = allowed.long()
    words = (bits.view(c, w, 32) << torch.arange(32)).sum(-1)  # [C, W] in 0 .. 2^32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("v", [37, 4096 + 77])
def test_kernel_matches_definition(dtype, v):
    g = torch.Generator().manual_seed(v)
    logits = torch.randn(6, v, generator=g).to(dtype)
    rows = torch.tensor([4, 0, 2])
    allowed = torch.rand(3, v, generator=g) < 0.3
    allowed[1] = False
    allowed[1, v - 1] = True  # the last token alone: the tail of the last word
    mask = pack(allowed)
    assert torch.equal(unpack_bitmask(mask, v), allowed)

    want = logits.clone()
    for i, r in enumerate(rows.tolist()):
        want[r][~allowed[i]] = float("-inf")
    ref = logits.clone()
    apply_bitmask_torch(ref, rows, mask)
    assert torch.equal(ref, want)
    got = logits.to(DEV)
    apply_bitmask(got, rows.to(DEV), mask.to(DEV))
    assert torch.equal(got.cpu(), want)


def test_no_rows_is_a_no_op_and_a_short_mask_is_refused():
    logits = torch.randn(2, 40)
    before = logits.clone()
    apply_bitmask(logits, torch.empty(0, dtype=torch.long), torch.empty(0, 2, dtype=torch.int32))
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="does not cover"):
        apply_bitmask(logits, torch.tensor([0]), torch.zeros(1, 1, dtype=torch.int32))


def test_llguidance_layout_is_the_kernels():
    """A regex allowing only the tokens '0'..'9' at the start: the mask llguidance fills has exactly their bits."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from multilora_cli.constraint import Constraint
    from multilora_cli.engine.grammar.compiler import GrammarCompiler

    vocab = {"<eos>": 0, **{ch: i + 1 for i, ch in enumerate("abc0123456789xyz")}}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    comp = GrammarCompiler(tok.to_str(), 40, [0])
    m = comp.matcher(Constraint("regex", "[0-9]+"))
    mask = torch.frombuffer(bytearray(m.compute_bitmask()), dtype=torch.int32)[None]
    allowed = unpack_bitmask(mask, 40)[0]
    assert allowed.nonzero().flatten().tolist() == [vocab[d] for d in "0123456789"]
