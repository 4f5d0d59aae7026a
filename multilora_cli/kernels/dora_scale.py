"""`dora_scale_triton`: DoRA's per-token scaling of a layer output in ONE pass (CUDA; the interpreter in tests).

    for t in range(T):                      # y: [T, N] (bf16 | fp16 | fp32), row stride stride_y, unit column stride
        s = token_slot[t]                   # token_slot: [T] int32, -1 = base row (left untouched: not read, not written)
        if s >= 0:
            g = scales[s, :]                # scales: [max_loras + 1, N] float32 (LoraWeights.dora)
            y[t, :] = round(g * y[t, :] + (1 - g) * bias)    # bias: [N] or absent (then 0); math in float32

The torch reference is kernels/dora.apply_dora_torch (what the CPU runs). In place of the torch ops' [T, N]
float32 gather and temporaries (~20 bytes moved per element), this reads y and g and writes y once (~8 bytes),
and skips base rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

BLOCK = 1024


@triton.jit
def _dora_scale_kernel(
    y_ptr, g_ptr, slot_ptr, bias_ptr, N, stride_y, stride_g, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr
):
    t = tl.program_id(0)
    s = tl.load(slot_ptr + t)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < tl.where(s >= 0, N, 0)  # base rows: no column
    s = tl.maximum(s, 0).to(tl.int64)  # masked anyway for base rows; keeps the address in range
    row = y_ptr + t.to(tl.int64) * stride_y + cols
    y = tl.load(row, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + s * stride_g + cols, mask=ok, other=1.0)
    out = y * g
    if HAS_BIAS:
        b = tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        out = out + (1.0 - g) * b
    tl.store(row, out.to(y_ptr.dtype.element_ty), mask=ok)


def dora_scale_triton(
    y: torch.Tensor, scales: torch.Tensor, token_slot: torch.Tensor, bias: torch.Tensor | None = None
) -> None:
    """In place, as the module docstring states. y: [T, N] with y.stride(1) == 1; token_slot: [T] int32 (a view
    of a graph's static buffer is fine: no host sync)."""
    t, n = y.shape
    if t == 0:
        return
    if y.stride(1) != 1 or scales.stride(1) != 1 or scales.shape[1] != n:
        raise ValueError(f"dora_scale_triton: y {tuple(y.shape)} / scales {tuple(scales.shape)} do not fit")
    grid = (t, triton.cdiv(n, BLOCK))
    launch(
        _dora_scale_kernel,
        grid,
        y,
        scales,
        token_slot,
        bias if bias is not None else scales,  # unused without HAS_BIAS
        n,
        y.stride(0),
        scales.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK=BLOCK,
    )
