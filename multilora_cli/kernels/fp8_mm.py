"""`weight_dequant_mm`: the small-M FP8 GEMM (decode batches), Triton. Semantics in the launcher's docstring;
`weight_dequant_mm_reference` is its torch twin. kernels/fp8.py picks it below Fp8Scheme.small_m tokens."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch


@triton.jit
def _dequant_mm_kernel(
    a_ptr,
    w_ptr,
    ws_ptr,
    as_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_ym,
    HAS_ASCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a_mask = (rm[:, None] < M) & (kk[None, :] < K)
        w_mask = (rn[:, None] < N) & (kk[None, :] < K)
        # e4m3 -> COMPUTE in registers (exact in bf16 / fp16 / fp32), masked lanes zeroed after the cast (an fp8
        # load's `other` does not cast under the interpreter); fp32 accumulation
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :], mask=a_mask)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=w_mask)
        a = tl.where(a_mask, a.to(COMPUTE), 0.0).to(COMPUTE)  # the cast again: the scalar must not promote
        w = tl.where(w_mask, w.to(COMPUTE), 0.0).to(COMPUTE)
        acc += tl.dot(a, tl.trans(w), input_precision=DOT_PREC, out_dtype=tl.float32)
    acc = acc * tl.load(ws_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if HAS_ASCALE:
        acc = acc * tl.load(as_ptr + rm, mask=rm < M, other=0.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


_COMPUTE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def weight_dequant_mm(
    a: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    a_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """y = (a @ wq^T) * a_scale * w_scale[None, :] (+ bias), fp32 accumulation, as out_dtype: [M, N].

    a: [M, K] e4m3 (quantized activations, a_scale [M, 1] fp32) or bf16 / fp16 / fp32 (weight-only, a_scale None);
    wq: [N, K] e4m3, w_scale: [N] fp32, bias: [N] or None. Operands are upcast in registers to out_dtype's
    tensor-core type (fp32 under TRITON_INTERPRET=1 tests). Reference: `weight_dequant_mm_reference`.
    """
    M, K = a.shape
    N = wq.shape[0]
    a, wq = a.contiguous(), wq.contiguous()
    y = torch.empty(M, N, device=a.device, dtype=out_dtype)
    block_m = 16 if M <= 16 else 32 if M <= 32 else 64
    block_n = 32 if N <= 8192 else 64
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    launch(  # through kernels/launch.py: engine/precompile.py's dry runs record and compile it ahead
        _dequant_mm_kernel,
        grid,
        a,
        wq,
        w_scale,
        a_scale if a_scale is not None else w_scale,
        bias if bias is not None else w_scale,
        y,
        M,
        N,
        K,
        a.stride(0),
        wq.stride(0),
        y.stride(0),
        HAS_ASCALE=a_scale is not None,
        HAS_BIAS=bias is not None,
        COMPUTE=_COMPUTE[out_dtype],
        DOT_PREC="ieee" if out_dtype == torch.float32 else "tf32",  # fp32: exact products, not tf32's (as sgmv_*)
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=128,
    )
    return y


def weight_dequant_mm_reference(
    a: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    a_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`weight_dequant_mm` in torch (fp32 math)."""
    y = a.float() @ wq.float().t() * w_scale.float()[None, :]
    if a_scale is not None:
        y = y * a_scale.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)
