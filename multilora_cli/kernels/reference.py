"""Pure-torch reference of the SGMV semantics, in float64. Tests compare every kernel against this."""

from __future__ import annotations

import torch

from multilora_cli.kernels.weights import LoraWeights


def add_lora_reference(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, token_slot: torch.Tensor) -> torch.Tensor:
    """Return y + LoRA delta, computed per token in float64 (y is not modified).

    y: [T, out_features], x: [T, in_features], token_slot: [T] int (-1 = base only).
    for t: s = token_slot[t]; if s < 0: skip
        for slice i with r = rank[s, i] > 0:
            y[t, off_i:off_i+1] += scale[s, i] * (x[t] @ a[s, i, :r].T) @ b[s, off_i:off_(i+1), :r].T
    """
    out = y.to(torch.float64).clone()
    xd = x.to(torch.float64)
    slots = token_slot.tolist()
    for t, s in enumerate(slots):
        if s < 0:
            continue
        for i in range(w.n_slices):
            r = int(w.rank[s, i])
            if r == 0:
                continue
            lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
            a = w.a[s, i, :r].to(torch.float64)  # [r, in]
            b = w.b[s, lo:hi, :r].to(torch.float64)  # [n, r]
            out[t, lo:hi] += float(w.scale[s, i]) * ((xd[t] @ a.T) @ b.T)
    return out
