"""`moe_reference`: the grouped torch computation of a sparse MoE block's experts, with per-token expert LoRA.

This is what every device runs today (CPU and CUDA), and the reference the fused MoE Triton kernels will be
compared against. Semantics (T tokens, hidden H, E experts, expert intermediate I, top-k K, L adapter slots,
R = max rank; S = 2 LoRA slices of gate_up (gate | up), 1 of down):

    x:        [T, H]            model dtype
    weights:  [T, K]            routing weights (float32 for Mixtral, model dtype for Qwen: as transformers gives them)
    experts:  [T, K]   int64    chosen experts (distinct per row)
    gate_up:  [E, 2I, H]        model dtype (rows: gate | up, transformers 5's fused layout)
    down:     [E, H, I]         model dtype
    slot:     [T]      int64    adapter slot of each token, -1 = base (only read with `lora`)
    lora:     ExpertLoraWeights or None

    out = zeros [T, H]
    for e in 0..E-1 (ascending, as transformers adds them):
        for each (t, k) with experts[t, k] == e:
            h = x[t] @ gate_up[e].T                                  # [2I]
            if slot[t] >= 0: h += gate_up_delta((x[t] @ gu_a[s, e].T) * gu_scale[s], gu_b[s, e])  # s = slot[t]
            a = silu(h[:I]) * h[I:]                                  # [I]
            y = a @ down[e].T                                        # [H]
            if slot[t] >= 0: y += ((a @ dn_a[s, e].T) * dn_scale[s]) @ dn_b[s, e].T
            out[t] += (y * weights[t, k]).to(out.dtype)

i.e. per (token, expert, adapter) y_e += s * (x A_e^T) B_e^T, added to each expert's output before the routing-
weighted sum. Grouping: the (t, k) pairs are sorted by (expert, slot) once (one host sync for the counts), then
each expert's tokens go through one matmul per weight and each (expert, slot) run through one shrink and expand.
Data-dependent shapes: not CUDA-graph safe (MoE models run eagerly until the fused kernels land).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from multilora_cli.kernels.expert_weights import ExpertLoraWeights, gate_up_delta


def route(logits: torch.Tensor, top_k: int, kind: str, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, K], experts [T, K] int64), exactly as transformers 5 computes them:
    softmax in float32, torch.topk (its order, ties included), renormalised over the top k (always for Mixtral,
    if norm_topk_prob for Qwen); Qwen casts the weights back to the logits' dtype, Mixtral keeps float32."""
    probs = torch.softmax(logits.float(), dim=-1)
    top, idx = torch.topk(probs, top_k, dim=-1)
    if kind == "mixtral" or norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    if kind != "mixtral":
        top = top.to(logits.dtype)
    return top, idx


def moe_reference(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    slot: torch.Tensor | None = None,
    lora: ExpertLoraWeights | None = None,
) -> torch.Tensor:
    """See the module docstring. Returns out [T, H] in x's dtype."""
    T, K = experts.shape
    E, two_i, _ = gate_up.shape
    inter = two_i // 2
    out = torch.zeros_like(x)
    tok = torch.arange(T, device=x.device).repeat_interleave(K)  # pair p = t * K + k
    flat_e = experts.reshape(-1)
    flat_w = weights.reshape(-1)
    use_lora = lora is not None and slot is not None
    if use_lora:
        n_slot = lora.max_loras + 1
        key = flat_e * n_slot + (slot[tok] + 1)  # sort by (expert, slot), base (-1) first
    else:
        n_slot, key = 1, flat_e
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=E * n_slot).tolist()  # the one host sync
    start = 0
    for e in range(E):
        runs = counts[e * n_slot : (e + 1) * n_slot]
        n = sum(runs)
        if n == 0:
            continue
        pairs = order[start : start + n]
        t = tok[pairs]
        xe = x[t]  # [n, H]
        h = F.linear(xe, gate_up[e])  # [n, 2I]
        if use_lora:
            _add_runs(h, xe, runs, lora.gu_a, lora.gu_b, lora.gu_scale, e)
        a = F.silu(h[:, :inter]) * h[:, inter:]  # [n, I]
        y = F.linear(a, down[e])  # [n, H]
        if use_lora:
            _add_runs(y, a, runs, lora.dn_a, lora.dn_b, lora.dn_scale, e)
        out.index_add_(0, t, (y * flat_w[pairs, None]).to(out.dtype))
        start += n
    return out


def _add_runs(y, x, runs, a, b, scale, e) -> None:
    """y[rows of slot s] += ((x[rows] @ a[s, e].T) * scale[s]) @ b[s, e].T for each slot's run (run 0 = base)."""
    lo = runs[0]
    for s, n in enumerate(runs[1:]):
        if n:
            shrink = F.linear(x[lo : lo + n], a[s, e]) * scale[s].to(x.dtype)  # [n, S*R]
            y[lo : lo + n] += gate_up_delta(shrink, b[s, e]) if b.shape[3] != a.shape[2] else F.linear(shrink, b[s, e])
            lo += n
