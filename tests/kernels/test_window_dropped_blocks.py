"""Block-table entries behind the sliding window may be dropped (-1, engine/block_manager.py): every attention path
(Triton decode and prefill kernels under TRITON_INTERPRET=1, the torch decode and prefill paths) gives the same
output as with the whole table and never reads through a dropped entry. The poison: the cache's last block is
all NaN, and dropped entries name it (explicitly, or as -1, which torch indexing wraps to the last block): one
read of it turns the row's output into NaN even when the scores are masked after the read (0 * NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from multilora_cli.layers.attention import Attention
from multilora_cli.layers.context import decode_context, prefill_context, reset_context, set_context
from tests.devices import KERNEL_DEVICE, needs_interpreter
from tests.kernels.test_paged_attention import _case, _prefill_reference, _reference

H, KVH, D, PAGE, W = 4, 2, 16, 4, 6

PATHS = [
    pytest.param(True, marks=needs_interpreter if KERNEL_DEVICE == "cpu" else ()),  # the Triton kernels
    False,  # the torch path
]


@pytest.fixture(autouse=True)
def _no_step_context_left():
    yield
    reset_context()


def _poisoned(kc: torch.Tensor, vc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The caches with one more block, all NaN, at the end; its index."""
    nan = torch.full((1, *kc.shape[1:]), float("nan"))
    return torch.cat([kc, nan]), torch.cat([vc, nan]), kc.shape[0]


def _drop(tables: list[list[int]], first_kept: list[int], mark: int) -> list[list[int]]:
    """Each table with its entries before `first_kept[b]` replaced by `mark`."""
    return [[mark] * k + t[k:] for t, k in zip(tables, first_kept)]


@pytest.mark.parametrize("triton", PATHS)
@pytest.mark.parametrize("explicit", [True, False])
def test_decode_never_reads_dropped_blocks(triton, explicit):
    """Contexts of 37, 9 and 22 tokens, window 6: a decode at position n - 1 reads positions n - 6 .. n - 1, so the
    blocks before (n - 6) // 4 are dropped."""
    lens = [37, 9, 22]
    q, kc, vc, tables, _ = _case(len(lens), H, KVH, D, PAGE, lens, seed=7)
    kc, vc, poison = _poisoned(kc, vc)
    dropped = _drop(tables, [(n - W) // PAGE for n in lens], poison if explicit else -1)
    assert any(t[0] in (poison, -1) for t in dropped)
    attn = Attention(H, KVH, D, 1 / math.sqrt(D), sliding_window=W, use_triton=triton)
    attn.set_cache(kc.clone().to(KERNEL_DEVICE if triton else "cpu"), vc.clone().to(KERNEL_DEVICE if triton else "cpu"))
    dev = attn.k_cache.device
    set_context(decode_context(lens, dropped, PAGE, device=dev))
    k_new, v_new = torch.randn(len(lens), KVH, D), torch.randn(len(lens), KVH, D)
    out = attn(q.to(dev), k_new.to(dev), v_new.to(dev)).cpu()
    ref = _reference(q, attn.k_cache.cpu(), attn.v_cache.cpu(), tables, lens, W)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("triton", PATHS)
@pytest.mark.parametrize("explicit", [True, False])
def test_chunked_prefill_never_reads_dropped_blocks(triton, explicit):
    """Chunks of 5 tokens after 25 cached, of 3 after 14, and a whole 7-token prompt: a chunk starting at s reads
    positions from s - 5 on, so the blocks before (s - 5) // 4 are dropped."""
    lq, lk = [5, 3, 7], [30, 17, 7]
    _, kc, vc, tables, _ = _case(len(lk), H, KVH, D, PAGE, lk, seed=8)
    kc, vc, poison = _poisoned(kc, vc)
    first = [max(0, k - q - W + 1) // PAGE for q, k in zip(lq, lk)]
    assert first == [5, 2, 0]
    dropped = _drop(tables, first, poison if explicit else -1)
    dev = KERNEL_DEVICE if triton else "cpu"
    attn = Attention(H, KVH, D, 1 / math.sqrt(D), sliding_window=W, use_triton=triton)
    attn.set_cache(kc.clone().to(dev), vc.clone().to(dev))
    set_context(prefill_context(lq, lk, dropped, PAGE, device=dev))
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lq), H, D, generator=g)
    k_new, v_new = torch.randn(sum(lq), KVH, D, generator=g), torch.randn(sum(lq), KVH, D, generator=g)
    out = attn(q.to(dev), k_new.to(dev), v_new.to(dev)).cpu()
    kcache, vcache = attn.k_cache.cpu(), attn.v_cache.cpu()
    start = 0
    for b in range(len(lq)):
        slots = [tables[b][p // PAGE] * PAGE + p % PAGE for p in range(lk[b])]
        k, v = kcache.reshape(-1, KVH, D)[slots], vcache.reshape(-1, KVH, D)[slots]
        ref = _prefill_reference(q[start : start + lq[b]], k, v, lq[b], lk[b], W, H // KVH)
        torch.testing.assert_close(out[start : start + lq[b]].double(), ref, atol=1e-5, rtol=0)
        start += lq[b]
