"""PinnedArena on CUDA: registered memory, async copies, and no block reuse before its copies ran."""

import pytest
import torch

from multilora_cli.engine.pinned import ALIGN, PinnedArena

pytestmark = pytest.mark.gpu


def test_registered_block_copies_async_and_waits_for_its_copies():
    arena = PinnedArena(64 * ALIGN, cuda=True)
    assert arena.registered
    block = arena.alloc(32 * ALIGN)
    src = block.tensor(32 * ALIGN // 2, torch.bfloat16)
    assert src.is_pinned()  # registered memory counts as page-locked for non_blocking copies
    src.copy_(torch.arange(src.numel()).to(torch.bfloat16))
    dst = torch.empty_like(src, device="cuda")
    torch.cuda._sleep(50_000_000)  # keep the stream busy so the copy is still queued
    dst.copy_(src, non_blocking=True)
    block.record()
    arena.release(block)
    again = arena.alloc(32 * ALIGN)  # the first block is pending: a fresh range, not the one being read
    assert again is not None and again.offset != block.offset
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), torch.arange(src.numel()).to(torch.bfloat16))
    arena.release(again)
    assert arena.free_bytes == arena.nbytes  # copies done: both back, merged
    arena.close()
    assert not arena.registered
