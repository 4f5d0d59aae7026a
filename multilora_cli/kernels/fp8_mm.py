"""`weight_dequant_mm`: the small-M FP8 GEMM (decode batches), Triton. Semantics in the launcher's docstring;
`weight_dequant_mm_reference` is its torch twin. kernels/fp8.py picks it below Fp8Scheme.small_m tokens.

Why split-K: at decode sizes (M <= 32) the GEMM is a weight stream, bound by HBM bytes. Tiling only over M and N
gives N / BLOCK_N programs (e.g. 64 for a 4096-wide o_proj), too few to keep 132 SMs' loads in flight; splitting K
over SPLIT_K programs multiplies them, each writing an fp32 partial tile. The partials are then summed in a fixed
order (split 0, 1, ...) by `_reduce_kernel`, which applies the scales and bias: results do not depend on timing
(no atomics), and the split is a function of (M, N, K) alone, so a row's result depends on the step's shape only.
"""

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
    K_PER_SPLIT,
    stride_am,
    stride_wn,
    stride_ym,
    HAS_ASCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_lo = pid_k * K_PER_SPLIT  # K_PER_SPLIT: a multiple of BLOCK_K
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = tl.max_contiguous(tl.multiple_of(k0 + rk, BLOCK_K), BLOCK_K)
        if EVEN_K:  # no mask along K: the row/column masks are uniform over K, so loads stay 16-byte vectors
            a_mask = (rm[:, None] < M) & (kk[None, :] >= 0)
            w_mask = (rn[:, None] < N) & (kk[None, :] >= 0)
        else:
            a_mask = (rm[:, None] < M) & (kk[None, :] < k_hi)
            w_mask = (rn[:, None] < N) & (kk[None, :] < k_hi)
        # e4m3 -> COMPUTE in registers (exact in bf16 / fp16 / fp32), masked lanes zeroed after the cast (an fp8
        # load's `other` does not cast under the interpreter); fp32 accumulation
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :], mask=a_mask)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=w_mask)
        if NATIVE_FP8:  # CUDA, e4m3 activations: FP8 tensor cores take both tiles as loaded (masked lanes are 0)
            acc += tl.dot(a, tl.trans(w), out_dtype=tl.float32)
        else:
            a = tl.where(a_mask, a.to(COMPUTE), 0.0).to(COMPUTE)  # the cast again: the scalar must not promote
            w = tl.where(w_mask, w.to(COMPUTE), 0.0).to(COMPUTE)
            acc += tl.dot(a, tl.trans(w), input_precision=DOT_PREC, out_dtype=tl.float32)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT > 1:  # an fp32 partial tile: y_ptr is the [SPLIT, M, N] workspace here
        tl.store(y_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=out_mask)
    else:
        acc = acc * tl.load(ws_ptr + rn, mask=rn < N, other=0.0)[None, :]
        if HAS_ASCALE:
            acc = acc * tl.load(as_ptr + rm, mask=rm < M, other=0.0)[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_kernel(
    part_ptr,
    ws_ptr,
    as_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    stride_ym,
    HAS_ASCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # one program per (row m, BLOCK_N columns): y[m, n] = (sum over s in order of part[s, m, n]) * scales + bias
    m, pid_n = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * M * N + m * N + rn, mask=mask, other=0.0)
    acc = acc * tl.load(ws_ptr + rn, mask=mask, other=0.0)
    if HAS_ASCALE:
        acc = acc * tl.load(as_ptr + m)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=mask)


_COMPUTE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def pick_config(M: int, N: int, K: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) for an [M, K] x [N, K]^T product, by shape alone.

    Fitted to a sweep on an H200 (benchmarks/bench_gemm.py --fp8 --sweep; Llama-3-8B layer shapes, M 1-32): 128-wide
    K tiles and 3 stages everywhere; N tiles of 128 up to ~8k outputs, 64 beyond; K split until the grid has
    ~6 programs per SM (split 8 for the 4k-6k-wide projections, 4 for gate_up's 28k)."""
    block_n = 128 if N <= 8192 else 64
    block_k = 128
    tiles = triton.cdiv(M, 16 if M <= 16 else 32) * triton.cdiv(N, block_n)
    k_blocks = triton.cdiv(K, block_k)
    split = 1
    while tiles * split < 1024 and split * 2 <= min(8, k_blocks // 2):
        split *= 2
    return block_n, block_k, split, 4, 3


def weight_dequant_mm(
    a: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    a_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    out_dtype: torch.dtype,
    config: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """y = (a @ wq^T) * a_scale * w_scale[None, :] (+ bias), fp32 accumulation, as out_dtype: [M, N].

    a: [M, K] e4m3 (quantized activations, a_scale [M, 1] fp32) or bf16 / fp16 / fp32 (weight-only, a_scale None);
    wq: [N, K] e4m3, w_scale: [N] fp32, bias: [N] or None. Operands are upcast in registers to out_dtype's
    tensor-core type (fp32 under TRITON_INTERPRET=1 tests). With SPLIT_K > 1 each split's fp32 partial goes to a
    [SPLIT_K, M, N] workspace, summed in split order by a second launch. config: `pick_config`'s tuple (a sweep
    passes its own). Reference: `weight_dequant_mm_reference`.
    """
    M, K = a.shape
    N = wq.shape[0]
    a, wq = a.contiguous(), wq.contiguous()
    block_n, block_k, split, warps, stages = config or pick_config(M, N, K)
    block_m = 16 if M <= 16 else 32 if M <= 32 else 64
    k_per = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    split = triton.cdiv(K, k_per)  # no empty split
    # fp8 x fp8 on the tensor cores where the hardware has them (sm_89+); the interpreter upcasts (its fp8 dot is
    # not exact), as does a weight-only call (a in bf16 / fp16 / fp32)
    native = a.dtype == wq.dtype and a.is_cuda and torch.cuda.get_device_capability(a.device) >= (8, 9)
    y = torch.empty(M, N, device=a.device, dtype=out_dtype)
    part = y if split == 1 else torch.empty(split, M, N, device=a.device, dtype=torch.float32)
    ascale = a_scale if a_scale is not None else w_scale
    bias_arg = bias if bias is not None else w_scale
    common = dict(HAS_ASCALE=a_scale is not None, HAS_BIAS=bias is not None, SPLIT=split)
    launch(  # through kernels/launch.py: engine/precompile.py's dry runs record and compile it ahead
        _dequant_mm_kernel,
        (triton.cdiv(M, block_m), triton.cdiv(N, block_n), split),
        a,
        wq,
        w_scale,
        ascale,
        bias_arg,
        part,
        M,
        N,
        K,
        k_per,
        a.stride(0),
        wq.stride(0),
        y.stride(0),
        EVEN_K=K % block_k == 0,
        NATIVE_FP8=native,
        COMPUTE=_COMPUTE[out_dtype],
        DOT_PREC="ieee" if out_dtype == torch.float32 else "tf32",  # fp32: exact products, not tf32's (as sgmv_*)
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
        **common,
    )
    if split > 1:
        launch(
            _reduce_kernel,
            (M, triton.cdiv(N, 1024)),
            part,
            w_scale,
            ascale,
            bias_arg,
            y,
            M,
            N,
            y.stride(0),
            BLOCK_N=1024,
            **common,
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
