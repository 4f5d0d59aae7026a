"""StepContext builders: the slot mapping and tensors a runner must produce, spelled out on a small case."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.layers.context import (
    StepContext,
    decode_context,
    get_context,
    prefill_context,
    reset_context,
    set_context,
)


def test_prefill_context_with_and_without_prefix():
    # seq 0: 5 new tokens at 0..4 in blocks [7, 2]; seq 1: 3 new tokens at 6..8 after 6 cached, blocks [4, 0, 9]
    ctx = prefill_context([5, 3], [5, 9], [[7, 2], [4, 0, 9]], block_size=4)
    assert ctx.is_prefill and ctx.has_prefix
    assert ctx.slot_mapping.tolist() == [28, 29, 30, 31, 8, 2, 3, 36]
    assert ctx.slot_mapping.dtype == torch.int64
    assert ctx.cu_seqlens_q.tolist() == [0, 5, 8] and ctx.cu_seqlens_k.tolist() == [0, 5, 14]
    assert ctx.cu_seqlens_q.dtype == torch.int32
    assert (ctx.max_seqlen_q, ctx.max_seqlen_k) == (5, 9)
    assert ctx.block_tables.tolist() == [[7, 2, 0], [4, 0, 9]]

    fresh = prefill_context([5, 3], [5, 3], [[7, 2], [4]], block_size=4)
    assert not fresh.has_prefix and fresh.block_tables is None


def test_decode_context():
    ctx = decode_context([5, 9], [[7, 2], [4, 0, 9]], block_size=4)
    assert not ctx.is_prefill
    assert ctx.slot_mapping.tolist() == [8, 36]  # position 4 of seq 0 (block 2), position 8 of seq 1 (block 9)
    assert ctx.context_lens.tolist() == [5, 9] and ctx.context_lens.dtype == torch.int32
    assert ctx.seqlens_q == [1, 1] and ctx.max_seqlen_k == 9


def test_context_validation_and_state():
    with pytest.raises(ValueError, match="blocks cannot hold"):
        prefill_context([5], [9], [[1, 2]], block_size=4)
    with pytest.raises(ValueError, match="decode needs"):
        StepContext(is_prefill=False, slot_mapping=torch.zeros(1, dtype=torch.int64))
    ctx = decode_context([1], [[0]], block_size=4)
    set_context(ctx)
    assert get_context() is ctx
    reset_context()
    assert get_context() is None
