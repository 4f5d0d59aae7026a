"""`scatter_blocks`: copy many dense source blocks into strided destination views in ONE launch.

Why: a slot load writes one adapter into ~256 destination views (A and B of every LoRA module; B transposed
into the rank-major slots). `torch._foreach_copy_` takes its slow route for such mixed strides, i.e. one copy
kernel and ~5-10 us of host time per view; here the views are described once in a table (cached per slot and
adapter layout) and one launch copies them all.

A plan is a device int64 table, one row per CHUNK-element piece of a block:
    (src_off, first, n, dst_off, cols, dst_stride_row, dst_stride_col, dst_step)
where the block is a row-major [rows, cols] source at element `src_off - first` of `src`, and its element
e = first + j (j < n) goes to dst_base + dst_off + shift * dst_step + (e // cols) * dst_stride_row
+ (e % cols) * dst_stride_col. `shift` is a launch argument: with dst_step = the slot stride of each destination
tensor, one plan built for slot 0 serves every slot (cached per layout, not per (slot, layout): a pool of 1,000
slots would otherwise build and keep 1,000 plans, one per slot's first load).
Destination offsets are element distances from `dst_base`, which may lie in other allocations of the same
device and dtype (an address difference, so any layout of the slot tensors works).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.meta import expand_counts

CHUNK = 4096
_COLS = 8


@triton.jit(do_not_specialize=["shift"])  # one compile for every slot
def _scatter_kernel(src_ptr, dst_ptr, plan_ptr, shift, CHUNK: tl.constexpr):
    row = plan_ptr + tl.program_id(0) * 8
    src_off = tl.load(row)
    first = tl.load(row + 1)
    n = tl.load(row + 2)
    dst_off = tl.load(row + 3)
    cols = tl.load(row + 4)
    s_row = tl.load(row + 5)
    s_col = tl.load(row + 6)
    step = tl.load(row + 7)
    dst_off += shift * step
    j = tl.arange(0, CHUNK)
    ok = j < n
    e = first + j  # element index within the block
    v = tl.load(src_ptr + src_off + j, mask=ok)
    tl.store(dst_ptr + dst_off + (e // cols) * s_row + (e % cols) * s_col, v, mask=ok)


def scatter_plan(
    dst: list[torch.Tensor],
    src: list[torch.Tensor],
    src_base: torch.Tensor,
    dst_base: torch.Tensor,
    steps: list[int] | None = None,
) -> torch.Tensor:
    """The plan table (int64, on dst_base's device) for copying src[i] -> dst[i] (shifted by `shift` x steps[i]
    elements at launch; steps default to 0).

    src[i]: a contiguous view of the 1-D `src_base`; dst[i]: a view of the same shape (2-D, or 3-D whose leading
    dimension is split into 2-D blocks), same dtype as dst_base, on dst_base's device.
    """
    steps = [0] * len(dst) if steps is None else steps
    if len(steps) != len(dst):
        raise ValueError(f"scatter_plan: {len(steps)} steps for {len(dst)} destinations")
    blocks: list[np.ndarray] = []  # per pair [k, 7]: (src off, numel, dst off, cols, row stride, col stride, step)
    isz = dst_base.element_size()
    for d, s, step in zip(dst, src, steps):
        if d.shape != s.shape or not s.is_contiguous() or d.dtype != dst_base.dtype or d.dim() not in (2, 3):
            raise ValueError(
                f"scatter_plan: dst {tuple(d.shape)} {d.dtype} / src {tuple(s.shape)} contiguous="
                f"{s.is_contiguous()} do not pair"
            )
        # a 3-D pair is d.shape[0] 2-D blocks, made in numpy (a MoE layer's PEFT lora_B is ~2,000 of them)
        k = np.arange(d.shape[0] if d.dim() == 3 else 1, dtype=np.int64)
        r, c = d.shape[-2:]
        lead_s, lead_d = (s.stride(0), d.stride(0)) if d.dim() == 3 else (0, 0)
        rows = np.empty((len(k), 7), dtype=np.int64)
        rows[:, 0] = (s.data_ptr() - src_base.data_ptr()) // isz + k * lead_s
        rows[:, 1] = r * c
        rows[:, 2] = (d.data_ptr() - dst_base.data_ptr()) // isz + k * lead_d
        rows[:, 3:] = (c, d.stride(-2), d.stride(-1), step)
        blocks.append(rows)
    if not blocks:
        return torch.zeros((0, _COLS), dtype=torch.int64, device=dst_base.device)
    # chunk rows in numpy: a Llama-3-8B rank-16 load is ~450 blocks / ~10k chunks (26 -> 3.5 ms on this CPU)
    b = np.concatenate(blocks)  # [nb, 7]
    per = -(-b[:, 1] // CHUNK)  # chunks per block
    which, k = expand_counts(per)  # block of each chunk, chunk index within its block
    first = k * CHUNK
    plan = np.stack(
        [
            b[which, 0] + first,
            first,
            np.minimum(CHUNK, b[which, 1] - first),
            b[which, 2],
            b[which, 3],
            b[which, 4],
            b[which, 5],
            b[which, 6],
        ],
        axis=1,
    )
    return torch.from_numpy(np.ascontiguousarray(plan)).to(dst_base.device)


def scatter_blocks(src_base: torch.Tensor, dst_base: torch.Tensor, plan: torch.Tensor, shift: int = 0) -> None:
    """Run a plan from `scatter_plan`: one launch, stream-ordered, no host sync.

    src_base: [N] any dtype equal to dst_base's; dst_base: any tensor of the destination allocations' dtype;
    plan: [P, 8] int64 on the same device; shift: int (the slot, for a plan built for slot 0 with slot strides).

        for (src_off, first, n, dst_off, cols, sr, sc, step) in plan, for j < n:
            e = first + j
            dst_base.flat[dst_off + shift * step + (e // cols) * sr + (e % cols) * sc] = src_base[src_off + j]
    """
    if src_base.dtype != dst_base.dtype or src_base.device != dst_base.device or plan.device != dst_base.device:
        raise ValueError(
            f"scatter_blocks: src {src_base.dtype} on {src_base.device}, dst {dst_base.dtype} on "
            f"{dst_base.device}, plan on {plan.device}"
        )
    if plan.dtype != torch.int64 or plan.dim() != 2 or plan.shape[1] != _COLS:
        raise ValueError(f"scatter_blocks: plan must be int64 [P, {_COLS}], got {plan.dtype} {tuple(plan.shape)}")
    if plan.shape[0]:
        launch(_scatter_kernel, (plan.shape[0],), src_base, dst_base, plan, int(shift), CHUNK=CHUNK)


def scatter_reference(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """What a plan does, with torch copies (tests)."""
    for d, s in zip(dst, src):
        d.copy_(s)
