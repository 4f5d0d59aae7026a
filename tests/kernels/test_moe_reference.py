"""`kernels/moe_reference.py`: routing equals transformers 5's routers (ties included), and the grouped expert path
equals its docstring's per-(token, expert) loop, with per-token expert LoRA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.moe_reference import moe_reference, route

H, E, K, INTER = 16, 6, 2, 12


def _hf_router(kind: str, weight: torch.Tensor, norm: bool):
    import transformers as tf

    if kind == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

        cfg = tf.MixtralConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=K)
        router = MixtralTopKRouter(cfg)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

        cfg = tf.Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K, norm_topk_prob=norm)
        router = Qwen3MoeTopKRouter(cfg)
    router.weight.data.copy_(weight)
    return router


@pytest.mark.parametrize("kind, norm", [("mixtral", True), ("qwen", True), ("qwen", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_equals_transformers_with_ties(kind, norm, dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(E, H, generator=g).to(dtype)
    w[3] = w[1]  # experts 1 and 3 always tie
    x = torch.randn(10, H, generator=g).to(dtype)
    x[:3] = 0  # every logit ties: topk's own order decides
    _, want_w, want_i = _hf_router(kind, w, norm).to(dtype)(x)
    got_w, got_i = route(F.linear(x, w), K, kind, norm)
    assert torch.equal(got_i, want_i)
    assert got_w.dtype == want_w.dtype and torch.equal(got_w, want_w)


def _loop(x, weights, experts, gate_up, down, slot, lora):
    """The docstring's semantics, token by token."""
    out = torch.zeros_like(x)
    for e in range(E):
        for t, k in zip(*torch.where(experts == e)):
            h = x[t] @ gate_up[e].T
            s = int(slot[t])
            if s >= 0:
                sg = (x[t] @ lora.gu_a[s, e].T) * lora.gu_scale[s]  # [2R]: gate ranks | up ranks
                b = lora.gu_b[s, e]  # [2I, R]: gate rows | up rows, each over its own ranks
                h = h + torch.cat([b[:INTER] @ sg[: b.shape[1]], b[INTER:] @ sg[b.shape[1] :]])
            a = F.silu(h[:INTER]) * h[INTER:]
            y = a @ down[e].T
            if s >= 0:
                y = y + ((a @ lora.dn_a[s, e].T) * lora.dn_scale[s]) @ lora.dn_b[s, e].T
            out[t] += (y * weights[t, k]).to(out.dtype)
    return out


def test_grouped_path_equals_the_loop_with_expert_lora():
    g = torch.Generator().manual_seed(1)
    T = 9
    x = torch.randn(T, H, generator=g)
    gate_up, down = torch.randn(E, 2 * INTER, H, generator=g), torch.randn(E, H, INTER, generator=g)
    weights, experts = route(torch.randn(T, E, generator=g), K, "qwen", True)
    lora = ExpertLoraWeights.empty(3, 4, E, H, INTER, torch.float32, "cpu")
    for slot, r in enumerate((4, 2, 3)):
        parts = {
            p: (torch.randn(E, r, i, generator=g), torch.randn(E, o, r, generator=g), 0.5 + slot)
            for p, i, o in (("gate", H, INTER), ("up", H, INTER), ("down", INTER, H))
        }
        if slot == 1:
            del parts["up"]  # a part the adapter leaves out stays the base's
        lora.set_slot(slot, parts)
    slot = torch.tensor([0, -1, 2, 1, 0, -1, 1, 2, 2])
    got = moe_reference(x, weights, experts, gate_up, down, slot, lora)
    want = _loop(x, weights, experts, gate_up, down, slot, lora)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    base = moe_reference(x, weights, experts, gate_up, down)
    torch.testing.assert_close(base[[1, 5]], got[[1, 5]], atol=0, rtol=0)  # base rows untouched
    assert (base[[0, 2, 3]] - got[[0, 2, 3]]).abs().min() > 1e-3
    lora.clear_slot(0)  # eviction: slot 0's rows are the base's again
    again = moe_reference(x, weights, experts, gate_up, down, slot, lora)
    torch.testing.assert_close(again[[0, 4]], base[[0, 4]], atol=1e-6, rtol=0)
