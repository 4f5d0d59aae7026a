"""A token bitmask applied to some rows of the logits, in place: the grammar mask of structured output.

For each constrained row i (logits row `rows[i]`):
    logits[rows[i], v] = -inf    for every v < V whose bit is 0: (mask[i, v // 32] >> (v % 32)) & 1 == 0
`mask` is [C, W] int32 with W = ceil(V / 32) (llguidance's layout: bit v % 32 of word v // 32, little-endian
within the word); other rows, and allowed tokens, are left as they are. The Triton kernel runs on CUDA;
`apply_bitmask_torch` is the same definition in torch ops (the CPU path and the tests' reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

BLOCK = 4096


@triton.jit(do_not_specialize_on_alignment=["mask", "rows"])  # views set per step: one variant per logits dtype
def _bitmask_kernel(logits, mask, rows, V, stride_l, W, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = v < V
    row = tl.load(rows + i).to(tl.int64)
    word = tl.load(mask + i * W + v // 32, mask=inside, other=-1)
    banned = ((word >> (v % 32)) & 1) == 0
    neg = tl.full([BLOCK], float("-inf"), tl.float32)
    tl.store(logits + row * stride_l + v, neg.to(logits.dtype.element_ty), mask=inside & banned)


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> None:
    """logits: [N, V] any float dtype, unit last stride, written in place; rows: [C] int64 (distinct rows of
    logits); mask: [C, W] int32, W >= ceil(V / 32). One launch, no host sync."""
    c, v = rows.shape[0], logits.shape[1]
    if c == 0:
        return
    if logits.stride(-1) != 1 or not mask.is_contiguous():
        raise ValueError("apply_bitmask: logits need a unit last stride and mask must be contiguous")
    if mask.shape[0] != c or mask.shape[1] * 32 < v:
        raise ValueError(f"apply_bitmask: mask {tuple(mask.shape)} does not cover {c} rows of {v} tokens")
    launch(
        _bitmask_kernel,
        (c, triton.cdiv(v, BLOCK)),
        logits,
        mask,
        rows,
        v,
        logits.stride(0),
        mask.shape[1],
        BLOCK=BLOCK,
        num_warps=4,
    )


def unpack_bitmask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[C, W] int32 -> [C, vocab_size] bool, True where the token is allowed."""
    bits = torch.arange(32, dtype=torch.int32, device=mask.device)
    allowed = (mask.unsqueeze(-1) >> bits) & 1  # [C, W, 32]
    return allowed.reshape(mask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask_torch(logits: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> None:
    """`apply_bitmask` in torch ops (same arguments, same in-place result)."""
    if rows.shape[0] == 0:
        return
    allowed = unpack_bitmask(mask, logits.shape[1])
    x = logits.index_select(0, rows)
    logits[rows] = x.masked_fill(~allowed, float("-inf"))
