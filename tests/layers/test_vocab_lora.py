"""layers/vocab_lora.VocabAdapters against its formulas in plain torch: the embedding LoRA and copy per token's slot,
the lm_head LoRA and copy per row (in the model dtype and on fp32 logits of a bf16 model), the copy pool."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.adapters.peft import LoraModule
from multilora_cli.adapters.vocab import VocabWeights
from multilora_cli.kernels import build_lora_meta
from multilora_cli.layers.vocab_lora import VocabAdapters

V, H, R = 20, 8, 4


def _adapters(dtype=torch.float32) -> tuple[VocabAdapters, dict[int, VocabWeights]]:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    va = VocabAdapters(
        3, R, V, H, dtype=dtype, device=torch.device("cpu"), embed_lora=True, head_lora=True, embed_full=1, head_full=1
    )
    slots = {
        0: VocabWeights(embed=LoraModule(rnd(2, V), rnd(H, 2), 1.5)),
        1: VocabWeights(head=LoraModule(rnd(3, H), rnd(V, 3), 0.5)),
        2: VocabWeights(embed_full=rnd(V, H), head_full=rnd(V, H)),
    }
    for s, w in slots.items():
        va.install(s, w)
    return va, slots


def test_embedding_rows():
    va, w = _adapters()
    E = torch.randn(V, H)
    ids = torch.tensor([3, 4, 5, 6, 7, 3])
    tok = [-1, 0, 1, 2, 0, 2]
    got = va.embed_rows(E[ids].clone(), ids, build_lora_meta(tok))
    want = E[ids].clone()
    for t, (i, s) in enumerate(zip(ids.tolist(), tok)):
        if s == 0:
            m = w[0].embed
            want[t] += m.scaling * m.a.T[i] @ m.b.T  # E[t] + s · A[:, t]ᵀ Bᵀ
        elif s == 2:
            want[t] = w[2].embed_full[i]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype, fp32_logits", [(torch.float32, False), (torch.bfloat16, True)])
def test_head_rows(dtype, fp32_logits):
    """fp32_logits: the logprob path (fp32 logits of a bf16 model): the delta is computed in fp32 too."""
    va, w = _adapters(dtype)
    W = torch.randn(V, H).to(dtype)
    h = torch.randn(5, H).to(dtype)
    rows = [1, -1, 2, 0, 1]
    out = torch.float32 if fp32_logits else dtype
    logits = (h.float() @ W.float().T).to(out)
    got = va.head_logits(logits.clone(), h, rows)
    want = logits.clone().float()
    for n, s in enumerate(rows):
        if s == 1:
            m = w[1].head
            want[n] += m.scaling * (h[n].float() @ m.a.float().T) @ m.b.float().T
        elif s == 2:
            want[n] = h[n].float() @ w[2].head_full.float().T
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(got.float(), want, **tol)
    assert got.dtype == out


def test_copy_pool_is_taken_and_given_back():
    va, w = _adapters()
    with pytest.raises(RuntimeError, match="no free full-weight"):
        va.install(0, VocabWeights(head_full=torch.zeros(V, H)))  # slot 2 holds the one copy
    va.clear(2)
    assert va.embed_full_of[2] == -1
    va.install(0, VocabWeights(head_full=torch.zeros(V, H)))  # the copy slot came back
    h = torch.randn(2, H)
    got = va.head_logits(torch.ones(2, V), h, [0, -1])
    assert torch.equal(got[0], torch.zeros(V)) and torch.equal(got[1], torch.ones(V))
