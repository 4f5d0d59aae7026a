"""One-launch RMSNorm (optionally fused with the residual add before it), rotary embedding and SiLU-and-mul
for CUDA tensors (the torch versions take 2-7 kernels
each, and SiLU / mul run strided over the fused gate|up output).

At decode batch sizes these elementwise ops move a few MB each, so their cost is launches, not bytes: per
layer the torch versions issue ~28 small kernels for two norms, two rotaries and the MLP activation, these
issue 5. They round where the torch/HF code rounds (to the activation dtype after each op); the GPU compiler
may fuse a multiply-add, so a rare element differs from the torch path by one unit in the last place.
`MULTILORA_FUSED_ELEMENTWISE=0` turns them off (the layers then run their torch code on CUDA too).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch


def enabled(x: torch.Tensor) -> bool:
    """Whether the layers use these kernels for `x` (CUDA tensors, unless MULTILORA_FUSED_ELEMENTWISE=0)."""
    return x.is_cuda and os.environ.get("MULTILORA_FUSED_ELEMENTWISE", "1") != "0"


@triton.jit
def _norm_store(x, w_ptr, out_ptrs, offs, mask, N, eps):
    """out = weight * normalise(x) for one fp32 row x [BLOCK], rounded as layers.norm.RMSNorm rounds."""
    dt = out_ptrs.dtype.element_ty
    var = tl.sum(x * x, 0) / N
    h = (x * (1.0 / tl.sqrt(var + eps))).to(dt)  # HF: h.to(dtype) before the weight
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptrs, (w.to(tl.float32) * h.to(tl.float32)).to(dt), mask=mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, R2, stride_x0, stride_x1, stride_o0, stride_o1, N, eps, BLOCK: tl.constexpr
):
    r = tl.program_id(0)
    r0, r1 = r // R2, r % R2
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + r0.to(tl.int64) * stride_x0 + r1 * stride_x1 + offs, mask=mask, other=0.0).to(tl.float32)
    _norm_store(x, w_ptr, out_ptr + r0.to(tl.int64) * stride_o0 + r1 * stride_o1 + offs, offs, mask, N, eps)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, stride_x, stride_r, stride_o, stride_s, N, eps, BLOCK: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + t * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(sum_ptr.dtype.element_ty)  # torch's x + r: the fp32 sum rounded once
    tl.store(sum_ptr + t * stride_s + offs, s, mask=mask)
    _norm_store(s.to(tl.float32), w_ptr, out_ptr + t * stride_o + offs, offs, mask, N, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalise(x) over the last dim, like layers.norm.RMSNorm. x: [T, N] or [T, H, N] with unit
    last stride (any other strides); returns a new contiguous tensor of x's shape and dtype."""
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    x3 = x if x.dim() == 3 else x.reshape(-1, 1, n)
    o3 = out if out.dim() == 3 else out.view(-1, 1, n)
    r1, r2 = x3.shape[0], x3.shape[1]
    block = triton.next_power_of_2(n)
    launch(
        _rms_norm_kernel,
        (r1 * r2,),
        x3,
        weight,
        o3,
        r2,
        x3.stride(0),
        x3.stride(1),
        o3.stride(0),
        o3.stride(1),
        n,
        float(eps),
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
    )
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one launch: the residual add of a decoder layer fused into the
    norm after it (one kernel and one [T, N] round trip fewer). x, residual: [T, N], unit last stride."""
    t, n = x.shape
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out)
    if t == 0:
        return out, summed
    x = x if x.stride(-1) == 1 else x.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    block = triton.next_power_of_2(n)
    launch(
        _add_rms_norm_kernel,
        (t,),
        x,
        residual,
        weight,
        out,
        summed,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        summed.stride(0),
        n,
        float(eps),
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
    )
    return out, summed


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    H,
    stride_xt,
    stride_xh,
    stride_c,
    stride_ot,
    stride_oh,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    m = (h[:, None] < H) & (d[None, :] < HALF)
    dt = out_ptr.dtype.element_ty
    # cos/sin: [T, 2*HALF] fp32 with equal halves; cast to the activation dtype like apply_rotary
    c = tl.load(cos_ptr + t * stride_c + d, mask=d < HALF, other=0.0).to(dt).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * stride_c + d, mask=d < HALF, other=0.0).to(dt).to(tl.float32)[None, :]
    base = x_ptr + t * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=m, other=0.0).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rounded after each op as the torch ops do
    o1 = ((x1 * c).to(dt).to(tl.float32) + (-x2 * s).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)).to(dt)
    obase = out_ptr + t * stride_ot + h[:, None] * stride_oh + d[None, :]
    tl.store(obase, o1, mask=m)
    tl.store(obase + HALF, o2, mask=m)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """layers.rotary.apply_rotary in one launch. x: [T, heads, D] (unit last stride), cos/sin: [T, D] fp32
    with cos[:, :D/2] == cos[:, D/2:] (as RotaryEmbedding builds them). Returns a new [T, heads, D]."""
    T, H, D = x.shape
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    half = D // 2
    launch(
        _rope_kernel,
        (T,),
        x,
        cos,
        sin,
        out,
        H,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        out.stride(0),
        out.stride(1),
        HALF=half,
        BLOCK_H=triton.next_power_of_2(H),
        BLOCK_D=triton.next_power_of_2(half),
        num_warps=4,
    )
    return out


@triton.jit
def silu_mul_store(out_ptrs, g, u, ok):
    """out = silu(g) * u in fp32, silu rounded to out's dtype first (as F.silu rounds to the activation dtype),
    the product rounded once. The one rounding rule of silu_mul and of the fused LoRA path (sgmv_silu.py)."""
    dt = out_ptrs.dtype.element_ty
    g = g.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(out_ptrs, (act * u.to(tl.float32)).to(dt), mask=ok)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, I, stride_x, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    g = tl.load(x_ptr + t * stride_x + offs, mask=m, other=0.0)
    u = tl.load(x_ptr + t * stride_x + I + offs, mask=m, other=0.0)
    silu_mul_store(out_ptr + t * stride_o + offs, g, u, m)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """F.silu(gate) * up for gate_up = [gate | up]: [T, 2I] (unit last stride) -> [T, I]."""
    T, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((T, i), dtype=gate_up.dtype, device=gate_up.device)
    if T == 0:
        return out
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    block = 1024
    launch(
        _silu_mul_kernel,
        (T, triton.cdiv(i, block)),
        gate_up,
        out,
        i,
        gate_up.stride(0),
        out.stride(0),
        BLOCK=block,
        num_warps=4,
    )
    return out
