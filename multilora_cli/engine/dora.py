"""DoRA's per-output-feature scale g = m / ||W + s·B·A||_row, computed once when an adapter enters a slot.

PEFT (peft/tuners/lora/dora.py `get_weight_norm`) takes the L2 norm of each output feature's row of the adapted
weight W + s·B·A (W: [out, in] as nn.Linear stores it, so fan_in_fan_out never applies to the served layers) and
detaches it: at inference it is a constant per (adapter, output feature), exactly what a slot can hold. Here it
is computed on the slot's device from the slot's own A / B (what the step multiplies with) and the base W, in
float32, expanded (`slice_scale`) so a load reads W once and never materialises W + s·B·A. Each packed slice (q | k | v,
gate | up) gets its own rows; slices the adapter does not adapt, and plain-LoRA adapters, keep g = 1.
"""

from __future__ import annotations

import torch

from multilora_cli.adapters.peft import SLICES
from multilora_cli.errors import EngineError

_CHUNK_ELEMS = 1 << 24  # rows per chunk * in_features: 64 MiB of float32 temporaries


def row_norms_sq(weight: torch.Tensor) -> torch.Tensor:
    """||W_row||² [out] float32 of weight [out, in], in row chunks (once per module, when DoRA is enabled)."""
    if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise EngineError(
            f"DoRA needs the base weights in a floating dtype to compute its norms; this base is {weight.dtype}",
            hint="serve DoRA adapters on a bf16 / fp16 / fp32 base (not FP8)",
        )
    out, fin = weight.shape
    sq = torch.empty(out, dtype=torch.float32, device=weight.device)
    step = max(1, _CHUNK_ELEMS // max(fin, 1))
    for lo in range(0, out, step):
        hi = min(out, lo + step)
        sq[lo:hi] = weight[lo:hi].float().square().sum(1)
    return sq


def _wa(weight: torch.Tensor, a32: torch.Tensor) -> torch.Tensor:
    """W Aᵀ [out, r] float32 with W read once in its own dtype (CUDA: a bf16 GEMM with a float32 output)."""
    if weight.dtype == torch.float32:
        return weight @ a32.T
    if weight.is_cuda:
        try:
            return torch.mm(weight, a32.T.to(weight.dtype), out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # an older torch: the float32 chunks below
            pass
    out, fin = weight.shape
    wa = torch.empty(out, a32.shape[0], dtype=torch.float32, device=weight.device)
    step = max(1, _CHUNK_ELEMS // max(fin, 1))
    for lo in range(0, out, step):
        hi = min(out, lo + step)
        wa[lo:hi] = weight[lo:hi].float() @ a32.T
    return wa


def slice_scale(
    weight: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: float,
    m: torch.Tensor,
    w_sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """g [out] float32 = m / ||weight + scaling · b @ a|| per row. weight: [out, in], a: [r, in], b: [out, r],
    m: [out] (any device; moved to weight's), w_sq: `row_norms_sq(weight)` when cached.

    Expanded so W is read once and W + s·B·A never materialises ([out, in] float32 per module and load):
        ||W_o + s·(BA)_o||² = ||W_o||² + 2s · B_o · (W Aᵀ)_o + s² · B_o (A Aᵀ) B_oᵀ
    In float32 the terms are of the size of the result (the delta is a small correction to W), so this agrees
    with PEFT's direct norm to float32 rounding (tests/models/test_model_dora.py)."""
    a32, b32 = a.float(), b.float()
    if w_sq is None:
        w_sq = row_norms_sq(weight)
    cross = (b32 * _wa(weight, a32)).sum(1)  # [out]
    delta_sq = ((b32 @ (a32 @ a32.T)) * b32).sum(1)  # [out]
    norm = (w_sq + (2.0 * scaling) * cross + (scaling * scaling) * delta_sq).clamp_min(0.0).sqrt()
    return m.to(device=weight.device, dtype=torch.float32) / norm


def write_scales(modules, slot: int, adapter, w_sq: dict | None = None) -> None:
    """Fill `LoraWeights.dora[slot]` of every module ([(layer, fused), LoRALinear]) that has DoRA rows: g for the
    slices `adapter` adapts with DoRA (read from the slot's A / B, installed before this call), 1 elsewhere.
    w_sq: {(layer, fused): row_norms_sq of the module's weight}, computed once by the caller."""
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
            sq = w_sq[(layer, fused)][lo:hi] if w_sq is not None else None
            row[lo:hi] = slice_scale(module.weight[lo:hi], w.a[slot, i, :r], w.b[slot, lo:hi, :r], scaling, m, sq)
