"""Triton paged-attention kernels (run under TRITON_INTERPRET=1, float32) and the torch decode path,
against a per-head float64 reference that reads each sequence's tokens through its block table; with sliding
windows and Gemma 2's logit soft-capping (scores -> tanh(s / cap) * cap)."""

from __future__ import annotations

import math

import pytest
import torch

from multilora_cli.kernels.kv_store import store_kv
from multilora_cli.kernels.paged_attention import paged_attention_decode
from multilora_cli.kernels.paged_prefill import paged_attention_prefill
from multilora_cli.layers.attention import Attention
from multilora_cli.layers.context import decode_context, reset_context, set_context
from tests.devices import KERNEL_DEVICE

DEV = KERNEL_DEVICE


@pytest.fixture(autouse=True)
def _no_step_context_left():
    """test_torch_decode_path_matches_reference sets the global step context: clear it for the tests after it."""
    yield
    reset_context()


def _on(*ts):
    return [t.to(DEV) for t in ts]


def _case(B, H, KVH, D, page, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page) for n in lens]
    nblocks = sum(need) + 3
    order = torch.randperm(nblocks, generator=g).tolist()  # scattered blocks
    tables, i = [], 0
    for n in need:
        tables.append(order[i : i + n])
        i += n
    kc = torch.randn(nblocks, page, KVH, D, generator=g)
    vc = torch.randn(nblocks, page, KVH, D, generator=g)
    q = torch.randn(B, H, D, generator=g)
    width = max(max(need), 1) + 2
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return q, kc, vc, tables, bt


def _capped(s, softcap):
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def _reference(q, kc, vc, tables, lens, window=None, softcap=None):
    B, H, D = q.shape
    page, KVH = kc.shape[1], kc.shape[2]
    out = torch.zeros(B, H, D, dtype=torch.float64)
    for b, n in enumerate(lens):
        lo = max(0, n - window) if window else 0
        slots = [tables[b][p // page] * page + p % page for p in range(lo, n)]
        if not slots:
            continue
        k = kc.reshape(-1, KVH, D)[slots].double()
        v = vc.reshape(-1, KVH, D)[slots].double()
        for h in range(H):
            kvh = h // (H // KVH)
            w = torch.softmax(_capped(k[:, kvh] @ q[b, h].double() / math.sqrt(D), softcap), 0)
            out[b, h] = w @ v[:, kvh]
    return out


SHAPES = [  # B, H, KVH, D, page, lens
    (3, 4, 2, 16, 4, [5, 1, 13]),  # GQA 2, partial last blocks
    (2, 8, 1, 32, 16, [40, 17]),  # MQA-like group 8, tile spans several pages
    (3, 2, 2, 24, 8, [9, 64, 70]),  # MHA, head_dim not a power of two, > one tile
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("splits,block_n", [(1, 16), (3, 16), (1, 64), (2, 32)])
@pytest.mark.parametrize("window,softcap", [(None, None), (6, None), (6, 1.5), (None, 0.7)])
def test_decode_kernel_matches_reference(shape, splits, block_n, window, softcap):
    B, H, KVH, D, page, lens = shape
    q, kc, vc, tables, bt = _case(B, H, KVH, D, page, lens)
    dq, dkc, dvc, dbt, dlens = _on(q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32))
    out = paged_attention_decode(
        dq,
        dkc,
        dvc,
        dbt,
        dlens,
        1 / math.sqrt(D),
        sliding_window=window,
        softcap=softcap,
        max_context_len=max(lens),
        num_splits=splits,
        block_n=block_n,
    ).cpu()
    ref = _reference(q, kc, vc, tables, lens, window, softcap)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("splits", [None, 1, 4])
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_decode_window_much_shorter_than_context(splits, softcap):
    """A 40-token window over contexts up to 300: the splits divide the window's tiles (not the context), every
    sequence's visible tokens are covered once."""
    B, H, KVH, D, page, lens = 3, 4, 2, 16, 8, [300, 37, 5]
    q, kc, vc, tables, bt = _case(B, H, KVH, D, page, lens, seed=5)
    dq, dkc, dvc, dbt, dlens = _on(q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32))
    out = paged_attention_decode(
        dq,
        dkc,
        dvc,
        dbt,
        dlens,
        1 / math.sqrt(D),
        sliding_window=40,
        softcap=softcap,
        max_context_len=max(lens),
        num_splits=splits,
        block_n=16,
    ).cpu()
    torch.testing.assert_close(out.double(), _reference(q, kc, vc, tables, lens, 40, softcap), atol=1e-5, rtol=0)


def test_decode_kernel_empty_sequence_gives_zeros():
    q, kc, vc, tables, bt = _case(2, 4, 2, 16, 4, [0, 6])
    dq, dkc, dvc, dbt, dlens = _on(q, kc, vc, bt, torch.tensor([0, 6], dtype=torch.int32))
    for splits in (1, 2):
        out = paged_attention_decode(
            dq, dkc, dvc, dbt, dlens, 0.25, max_context_len=40, num_splits=splits, block_n=16
        ).cpu()
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        torch.testing.assert_close(out[1].double(), _reference(q, kc, vc, tables, [0, 6])[1], atol=1e-5, rtol=0)


def test_store_kv_writes_rows_and_skips_minus_one():
    kc, vc = torch.zeros(4, 4, 2, 8, device=DEV), torch.zeros(4, 4, 2, 8, device=DEV)
    qkv = torch.randn(5, 3 * 16, device=DEV)  # k and v are strided views of a fused projection, as in the model
    k, v = qkv[:, 16:32].view(5, 2, 8), qkv[:, 32:].view(5, 2, 8)
    slots = torch.tensor([3, -1, 15, 0, 9], device=DEV)
    store_kv(k, v, kc, vc, slots)
    kc, vc, k, v = kc.cpu(), vc.cpu(), k.cpu(), v.cpu()
    ek, ev = torch.zeros(16, 2, 8), torch.zeros(16, 2, 8)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            ek[s], ev[s] = k[t], v[t]
    assert torch.equal(kc.view(16, 2, 8), ek) and torch.equal(vc.view(16, 2, 8), ev)


@pytest.mark.parametrize("window,softcap", [(None, None), (6, None), (6, 1.5)])
def test_torch_decode_path_matches_reference(window, softcap):
    B, H, KVH, D, page, lens = SHAPES[0]
    q, kc, vc, tables, _ = _case(B, H, KVH, D, page, lens, seed=2)
    attn = Attention(H, KVH, D, 1 / math.sqrt(D), sliding_window=window, use_triton=False, softcap=softcap)
    attn.set_cache(kc.clone(), vc.clone())
    set_context(decode_context(lens, tables, page))
    # the new token's k/v is written first; reference sees the cache after that write
    k_new, v_new = torch.randn(B, KVH, D), torch.randn(B, KVH, D)
    out = attn(q, k_new, v_new)
    torch.testing.assert_close(
        out.double(), _reference(q, attn.k_cache, attn.v_cache, tables, lens, window, softcap), atol=1e-5, rtol=0
    )
    last = [tables[b][(n - 1) // page] * page + (n - 1) % page for b, n in enumerate(lens)]
    assert torch.equal(attn.k_cache.view(-1, KVH, D)[last], k_new)


def _prefill_reference(q, k, v, lq, lk, window, group, softcap=None):
    """q: [lq, H, D] at positions lk-lq.., k/v: [lk, KVH, D] -> [lq, H, D] float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(lq):
        p = lk - lq + i
        keys = [j for j in range(lk) if j <= p and (not window or j > p - window)]
        for h in range(q.shape[1]):
            s = k[keys, h // group].double() @ q[i, h].double() / math.sqrt(q.shape[-1])
            out[i, h] = torch.softmax(_capped(s, softcap), 0) @ v[keys, h // group].double()
    return out


@pytest.mark.parametrize("H,KVH,D,page", [(4, 2, 16, 4), (14, 2, 16, 8), (3, 3, 24, 4)])
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (5, 1.5)])
def test_prefill_kernel_with_cached_prefix(H, KVH, D, page, window, softcap):
    """Paged mode: sequences with no, short and long prefixes; GQA groups 2 and 7 (padded), MHA."""
    lq, lk = [7, 1, 20], [7, 9, 33]
    q, kc, vc, tables, bt = _case(len(lk), H, KVH, D, page, lk, seed=4)
    q = torch.randn(sum(lq), H, D)
    cu_q = torch.tensor([0, 7, 8, 28], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 16, 49], dtype=torch.int32)
    dq, dkc, dvc, dbt, dcq, dck = _on(q, kc, vc, bt, cu_q, cu_k)
    out = paged_attention_prefill(
        dq,
        None,
        None,
        dcq,
        dck,
        max(lq),
        1 / math.sqrt(D),
        k_cache=dkc,
        v_cache=dvc,
        block_tables=dbt,
        sliding_window=window,
        softcap=softcap,
        block_n=16,
    ).cpu()
    start = 0
    for b in range(3):
        slots = [tables[b][p // page] * page + p % page for p in range(lk[b])]
        k, v = kc.reshape(-1, KVH, D)[slots], vc.reshape(-1, KVH, D)[slots]
        ref = _prefill_reference(q[start : start + lq[b]], k, v, lq[b], lk[b], window, H // KVH, softcap)
        torch.testing.assert_close(out[start : start + lq[b]].double(), ref, atol=1e-5, rtol=0)
        start += lq[b]


@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (5, 1.5), (None, 0.7)])
def test_prefill_kernel_packed_kv(window, softcap):
    """Unpaged mode: keys are the step's own (strided) k/v rows."""
    H, KVH, D, lens = 8, 2, 32, [5, 70, 1]
    T = sum(lens)
    qkv = torch.randn(T, (H + 2 * KVH) * D)
    q = qkv[:, : H * D].view(T, H, D)
    k = qkv[:, H * D : (H + KVH) * D].view(T, KVH, D)
    v = qkv[:, (H + KVH) * D :].view(T, KVH, D)
    cu = torch.tensor([0, 5, 75, 76], dtype=torch.int32)
    dq, dk, dv, dcu = _on(q, k, v, cu)
    out = paged_attention_prefill(
        dq, dk, dv, dcu, dcu, max(lens), 1 / math.sqrt(D), sliding_window=window, softcap=softcap
    ).cpu()
    for b in range(3):
        lo, hi = cu[b].item(), cu[b + 1].item()
        ref = _prefill_reference(q[lo:hi], k[lo:hi], v[lo:hi], hi - lo, hi - lo, window, H // KVH, softcap)
        torch.testing.assert_close(out[lo:hi].double(), ref, atol=1e-5, rtol=0)
