"""DoRA's per-output-feature scale g = m / ||W + s·B·A||_row, computed once when an adapter enters a slot.

PEFT (peft/tuners/lora/dora.py `get_weight_norm`) takes the L2 norm of each output feature's row of the adapted
weight W + s·B·A (W: [out, in] as nn.Linear stores it, so fan_in_fan_out never applies to the served layers) and
detaches it: at inference it is a constant per (adapter, output feature), exactly what a slot can hold. Here it
is computed on the slot's device from the slot's own A / B (what the step multiplies with) and the base W, in
float32, in row chunks so a [28672, 4096] gate_up slice never materialises whole. Each packed slice (q | k | v,
gate | up) gets its own rows; slices the adapter does not adapt, and plain-LoRA adapters, keep g = 1.
"""

from __future__ import annotations

import torch

from multilora_cli.adapters.peft import SLICES
from multilora_cli.errors import EngineError

_CHUNK_ELEMS = 1 << 24  # rows per chunk * in_features: 64 MiB of float32 temporaries


def slice_scale(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float, m: torch.Tensor
) -> torch.Tensor:
    """g [out] float32 = m / ||weight + scaling · b @ a|| per row. weight: [out, in], a: [r, in], b: [out, r],
    m: [out] (any device; moved to weight's)."""
    if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise EngineError(
            f"DoRA needs the base weights in a floating dtype to compute its norms; this base is {weight.dtype}",
            hint="serve DoRA adapters on a bf16 / fp16 / fp32 base (not FP8)",
        )
    out, fin = weight.shape
    a32, b32 = a.float(), b.float()
    norm = torch.empty(out, dtype=torch.float32, device=weight.device)
    step = max(1, _CHUNK_ELEMS // max(fin, 1))
    for lo in range(0, out, step):
        hi = min(out, lo + step)
        rows = torch.addmm(weight[lo:hi].float(), b32[lo:hi], a32, alpha=scaling)  # [rows, in]; W untouched
        norm[lo:hi] = torch.linalg.vector_norm(rows, dim=1)
    return m.to(device=weight.device, dtype=torch.float32) / norm


def write_scales(modules, slot: int, adapter) -> None:
    """Fill `LoraWeights.dora[slot]` of every module ([(layer, fused), LoRALinear]) that has DoRA rows: g for the
    slices `adapter` adapts with DoRA (read from the slot's A / B, installed before this call), 1 elsewhere."""
    mags = getattr(adapter, "magnitudes", None) or {}
    for (layer, fused), module in modules:
        w = module.lora
        if w.dora is None:
            if mags and any((layer, n) in mags for n in SLICES[fused]):
                raise EngineError(
                    f"adapter {adapter.name!r} is a DoRA adapter but the engine was started without DoRA rows",
                    hint="this is a bug: the engine enables DoRA when any adapter of the run uses it",
                )
            continue
        row = w.dora[slot]
        row.fill_(1.0)
        for i, name in enumerate(SLICES[fused]):
            m = mags.get((layer, name))
            if m is None:
                continue
            lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
            spec = adapter.modules[(layer, name)]  # rank and scaling from the host (no device sync)
            r, scaling = spec.rank, spec.scaling
            row[lo:hi] = slice_scale(module.weight[lo:hi], w.a[slot, i, :r], w.b[slot, lo:hi, :r], scaling, m)
