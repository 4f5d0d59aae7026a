"""`quantize_rows_fp8`: FP8 activation quantization in one launch (per-token dynamic scales, or one static scale).

The torch formula of kernels/fp8.quantize_activations takes six passes over x (an fp32 copy, abs, amax, divide,
clamp, cast): for the 8192 x 14336 input of a Llama-3-8B down_proj that is ~3 GB of traffic, more than the FP8
GEMM saves. This kernel reads x twice (absmax, then quantize) and writes e4m3 once, with the same arithmetic:
the scale times the fp32 reciprocal of 448, IEEE division (`div_rn`) of x by it and round-to-nearest-even casts, so its output equals the torch formula bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

FP8_MAX = 448.0
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # kernels/fp8.MIN_SCALE (kept equal: test_fp8_quant checks it)


@triton.jit
def _quant_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    static_ptr,
    K,
    stride_x,
    stride_q,
    scale_ub,
    STATIC: tl.constexpr,
    HAS_UB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    offs0 = tl.arange(0, BLOCK)
    if STATIC:
        s = tl.load(static_ptr)
    else:
        amax = tl.zeros((), tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + offs0
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
        if HAS_UB:
            amax = tl.minimum(amax, scale_ub)
        s = tl.maximum(amax * (1.0 / 448.0), 1.0 / (448.0 * 512.0))  # fp32 reciprocal, as the torch formula
    tl.store(s_ptr + row, s)
    for k0 in range(0, K, BLOCK):
        offs = k0 + offs0
        m = offs < K
        x = tl.load(x_row + offs, mask=m, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, s), -448.0), 448.0)
        tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=m)


def quantize_rows_fp8(
    x: torch.Tensor,
    static_scale: torch.Tensor | None = None,
    scale_ub: float | None = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (bf16 / fp16 / fp32, rows contiguous) -> (xq [M, K] float8_e4m3fn, x_scale [M, 1] fp32):

        s[m]  = static_scale                                              if given ([1] fp32, already clamped)
              = max(min(max_k |x[m, k]|, scale_ub) * fp32(1/448), MIN_SCALE)   else (per-token dynamic)
        xq[m] = e4m3(clamp(x[m] / s[m], -448, 448))                      (fp32 math, round to nearest even)

    Reference: kernels/fp8.quantize_activations (the same numbers). out_dtype float32 stores the clamped
    quotients before the cast (the interpreter's e4m3 cast is an emulation that can be off: CPU tests check the
    arithmetic that way, GPU tests the e4m3 bits)."""
    M, K = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    xq = torch.empty(M, K, device=x.device, dtype=out_dtype)
    s = torch.empty(M, 1, device=x.device, dtype=torch.float32)
    if M == 0:
        return xq, s
    launch(
        _quant_rows_kernel,
        (M,),
        x,
        xq,
        s,
        static_scale if static_scale is not None else s,
        K,
        x.stride(0),
        xq.stride(0),
        float(scale_ub) if scale_ub is not None else 0.0,
        STATIC=static_scale is not None,
        HAS_UB=scale_ub is not None,
        BLOCK=1024 if K >= 1024 else triton.next_power_of_2(K),
    )
    return xq, s
