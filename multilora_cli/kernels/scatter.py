"""`scatter_blocks`: copy many dense source blocks into strided destination views in a few launches.

Why: a slot load writes one adapter into ~256 destination views (A and B of every LoRA module; B transposed
into the rank-major slots; a MoE adapter's expert parts ~290k pieces). `torch._foreach_copy_` takes its slow
route for such mixed strides, i.e. one copy kernel and ~5-10 us of host time per view; here the views are
described once in tables (cached per adapter layout) and one launch per table copies them all.

A block is a row-major [rows, cols] source at element `src_off` of `src`; its element (i, j) goes to
dst_base + dst_off + shift * step + i * s_row + j * s_col. `shift` is a launch argument: with step = the slot
stride of each destination tensor, one plan built for slot 0 serves every slot (cached per layout, not per
(slot, layout): a pool of 1,000 slots would otherwise build and keep 1,000 plans). Destination offsets are
element distances from `dst_base`, which may lie in other allocations of the same device and dtype.

Three tables, by the shape of the destination (offsets, strides, steps, element counts and a transposed block's
rows and columns multiples of ALIGN elements, else the block goes to the strided table: the kernels' hints):
- flat: destinations consecutive in the block's element order (A blocks, expert A parts): CHUNK-element pieces
  copied with 16-byte vector loads and stores, rows (src_off, n, dst_off, step);
- transposed: s_row == 1 (B blocks into rank-major slots): tiles of TILE_R source rows x TILE_C columns, loaded
  along the rows and stored along the columns (Triton moves the tile through shared memory so both sides
  coalesce), rows (src_off, n_rows, dst_off, cols, n_cols, s_col, step);
- strided: anything else, element by element, rows (src_off, first, n, dst_off, cols, s_row, s_col, step).
Why three: one element-wise kernel for all (the previous form) took 9.8 ms for a 1.29 GB Qwen3-30B-A3B
adapter on an H200 against 0.61 ms for a device copy of the same bytes, its transposed stores 6.9 ms of it; a load
beside a decode step lengthens the step by about the scatter's time (benchmarks/HISTORY.md, session 31).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.meta import expand_counts

CHUNK = 4096  # elements a program copies (flat and strided tables)
TILE_R, TILE_C = 256, 16  # a transposed tile: source rows x columns (TILE_R * TILE_C == CHUNK)
ALIGN = 8  # elements: 16 bytes of bf16 / fp16 (32 of fp32)


@triton.jit(do_not_specialize=["shift"])  # one compile for every slot
def _flat_kernel(src_ptr, dst_ptr, plan_ptr, shift, CHUNK: tl.constexpr, ALIGN: tl.constexpr):
    row = plan_ptr + tl.program_id(0) * 4
    src_off = tl.multiple_of(tl.load(row), ALIGN)
    n = tl.multiple_of(tl.load(row + 1), ALIGN)  # (whole runs: the mask keeps the accesses 16-byte vectors)
    dst_off = tl.multiple_of(tl.load(row + 2) + shift * tl.multiple_of(tl.load(row + 3), ALIGN), ALIGN)
    j = tl.arange(0, CHUNK)
    ok = j < n
    v = tl.load(src_ptr + src_off + j, mask=ok)
    tl.store(dst_ptr + dst_off + j, v, mask=ok)


@triton.jit(do_not_specialize=["shift"])
def _transposed_kernel(
    src_ptr, dst_ptr, plan_ptr, shift, TILE_R: tl.constexpr, TILE_C: tl.constexpr, ALIGN: tl.constexpr
):
    row = plan_ptr + tl.program_id(0) * 7
    src_off = tl.multiple_of(tl.load(row), ALIGN)
    n_rows = tl.multiple_of(tl.load(row + 1), ALIGN)
    dst_off = tl.load(row + 2)
    cols = tl.multiple_of(tl.load(row + 3), ALIGN)
    n_cols = tl.multiple_of(tl.load(row + 4), ALIGN)
    s_col = tl.multiple_of(tl.load(row + 5), ALIGN)
    dst_off = tl.multiple_of(dst_off + shift * tl.multiple_of(tl.load(row + 6), ALIGN), ALIGN)
    i = tl.arange(0, TILE_R)[:, None]
    j = tl.arange(0, TILE_C)[None, :]
    ok = (i < n_rows) & (j < n_cols)
    v = tl.load(src_ptr + src_off + i * cols + j, mask=ok)
    tl.store(dst_ptr + dst_off + i + j * s_col, v, mask=ok)


@triton.jit(do_not_specialize=["shift"])
def _strided_kernel(src_ptr, dst_ptr, plan_ptr, shift, CHUNK: tl.constexpr):
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


@dataclass(frozen=True, slots=True)
class ScatterPlan:
    """The three tables of a plan (int64, on the destination's device; module docstring): flat [P, 4],
    transposed [P, 7], strided [P, 8]; an empty table is not launched."""

    flat: torch.Tensor
    transposed: torch.Tensor
    strided: torch.Tensor

    @property
    def rows(self) -> int:
        """Programs over the three launches."""
        return sum(int(t.shape[0]) for t in (self.flat, self.transposed, self.strided))

    @property
    def device(self) -> torch.device:
        return self.flat.device

    @classmethod
    def noop(cls, device: torch.device) -> ScatterPlan:
        """One row per table that copies nothing: a dry run's launches of all three kernels (engine/precompile.py)."""
        z = torch.zeros(1, 8, dtype=torch.int64, device=device)
        strided = z.clone()
        strided[0, 4] = 1  # cols: no division by zero, were it run
        return cls(z[:, :4].contiguous(), z[:, :7].contiguous(), strided)


def scatter_plan(
    dst: list[torch.Tensor],
    src: list[torch.Tensor],
    src_base: torch.Tensor,
    dst_base: torch.Tensor,
    steps: list[int] | None = None,
) -> ScatterPlan:
    """The plan for copying src[i] -> dst[i] (shifted by `shift` x steps[i] elements at launch; steps default
    to 0).

    src[i]: a contiguous view of the 1-D `src_base`; dst[i]: a view of the same shape (2-D, or 3-D whose leading
    dimension is split into 2-D blocks), same dtype as dst_base, on dst_base's device.
    """
    steps = [0] * len(dst) if steps is None else steps
    if len(steps) != len(dst):
        raise ValueError(f"scatter_plan: {len(steps)} steps for {len(dst)} destinations")
    blocks: list[np.ndarray] = []  # per pair [k, 7]: (src off, rows, cols, dst off, row stride, col stride, step)
    isz = dst_base.element_size()
    for d, s, step in zip(dst, src, steps):
        if d.numel() == 0 and d.shape == s.shape:
            continue  # nothing to copy (and an empty view may not merge its dims)
        if d.shape != s.shape or not s.is_contiguous() or d.dtype != dst_base.dtype or d.dim() not in (2, 3):
            raise ValueError(
                f"scatter_plan: dst {tuple(d.shape)} {d.dtype} / src {tuple(s.shape)} contiguous="
                f"{s.is_contiguous()} do not pair"
            )
        if d.dim() == 3 and d.stride(0) == d.shape[1] * d.stride(1):
            # its leading dims merge into one: a MoE layer's PEFT lora_B [out, r, E] into [E, out, r] slots is then
            # one [out * r, E] transposed block, not out [r, E] blocks of r rows (16-row tiles of 256 rows)
            d, s = d.view(-1, d.shape[2]), s.view(-1, s.shape[2])  # views (a copy would lose the offsets)
        # a 3-D pair is d.shape[0] 2-D blocks, made in numpy
        k = np.arange(d.shape[0] if d.dim() == 3 else 1, dtype=np.int64)
        r, c = d.shape[-2:]
        lead_s, lead_d = (s.stride(0), d.stride(0)) if d.dim() == 3 else (0, 0)
        rows = np.empty((len(k), 7), dtype=np.int64)
        rows[:, 0] = (s.data_ptr() - src_base.data_ptr()) // isz + k * lead_s
        rows[:, 1:3] = (r, c)
        rows[:, 3] = (d.data_ptr() - dst_base.data_ptr()) // isz + k * lead_d
        rows[:, 4:] = (d.stride(-2), d.stride(-1), step)
        blocks.append(rows)
    device = dst_base.device
    if not blocks:
        empty = torch.zeros((0, 4), dtype=torch.int64, device=device)
        return ScatterPlan(empty, empty.new_zeros((0, 7)), empty.new_zeros((0, 8)))
    # pieces made in numpy: a Llama-3-8B rank-16 load is ~450 blocks, a Qwen3-30B-A3B one ~206k pieces
    b = np.concatenate(blocks)  # [nb, 7]
    so, r, c, do, sr, sc, st = b.T
    # the vector tables' hints (module docstring) hold by construction: offsets, strides, steps and the masks'
    # bounds (element counts, rows of a transposed block, its columns) multiples of ALIGN
    aligned = (so % ALIGN == 0) & (do % ALIGN == 0) & (st % ALIGN == 0)
    consecutive = ((c == 1) | (sc == 1)) & ((r == 1) | (sr == c))  # dst(i, j) = dst_off + i * c + j
    flat = aligned & consecutive & ((r * c) % ALIGN == 0)
    trans = aligned & ~consecutive & (sr == 1) & (r % ALIGN == 0) & (c % ALIGN == 0) & (sc % ALIGN == 0)
    strided = ~flat & ~trans

    def table(columns: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(np.stack(columns, axis=1))).to(device)

    def chunks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each block's CHUNK-element pieces: (its block's row, first element, elements)."""
        n = blocks[:, 1] * blocks[:, 2]
        which, k = expand_counts(-(-n // CHUNK))
        first = k * CHUNK
        return blocks[which], first, np.minimum(CHUNK, n[which] - first)

    fw, first, n = chunks(b[flat])
    flat_t = table([fw[:, 0] + first, n, fw[:, 3] + first, fw[:, 6]])

    t = b[trans]
    tr, tc = -(-t[:, 1] // TILE_R), -(-t[:, 2] // TILE_C)  # tiles along rows, along columns
    which, k = expand_counts(tr * tc)
    i0, j0 = (k // tc[which]) * TILE_R, (k % tc[which]) * TILE_C
    tw = t[which]
    trans_t = table(
        [
            tw[:, 0] + i0 * tw[:, 2] + j0,
            np.minimum(TILE_R, tw[:, 1] - i0),
            tw[:, 3] + i0 + j0 * tw[:, 5],
            tw[:, 2],
            np.minimum(TILE_C, tw[:, 2] - j0),
            tw[:, 5],
            tw[:, 6],
        ]
    )

    gw, first, n = chunks(b[strided])
    strided_t = table([gw[:, 0] + first, first, n, gw[:, 3], gw[:, 2], gw[:, 4], gw[:, 5], gw[:, 6]])
    return ScatterPlan(flat_t, trans_t, strided_t)


def scatter_blocks(src_base: torch.Tensor, dst_base: torch.Tensor, plan: ScatterPlan, shift: int = 0) -> None:
    """Run a plan from `scatter_plan`: up to three launches, stream-ordered, no host sync.

    src_base: [N] any dtype equal to dst_base's; dst_base: any tensor of the destination allocations' dtype;
    plan: a `ScatterPlan` on the same device; shift: int (the slot, for a plan built for slot 0 with slot
    strides).

        for each block (src_off, rows, cols, dst_off, s_row, s_col, step) of the plan, i < rows, j < cols:
            dst_base.flat[dst_off + shift * step + i * s_row + j * s_col] = src_base[src_off + i * cols + j]
    """
    if src_base.dtype != dst_base.dtype or src_base.device != dst_base.device or plan.device != dst_base.device:
        raise ValueError(
            f"scatter_blocks: src {src_base.dtype} on {src_base.device}, dst {dst_base.dtype} on "
            f"{dst_base.device}, plan on {plan.device}"
        )
    shift = int(shift)
    if plan.flat.shape[0]:
        launch(_flat_kernel, (plan.flat.shape[0],), src_base, dst_base, plan.flat, shift, CHUNK=CHUNK, ALIGN=ALIGN)
    if plan.transposed.shape[0]:
        grid = (plan.transposed.shape[0],)
        launch(
            _transposed_kernel,
            grid,
            src_base,
            dst_base,
            plan.transposed,
            shift,
            TILE_R=TILE_R,
            TILE_C=TILE_C,
            ALIGN=ALIGN,
        )
    if plan.strided.shape[0]:
        launch(_strided_kernel, (plan.strided.shape[0],), src_base, dst_base, plan.strided, shift, CHUNK=CHUNK)


def scatter_reference(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """What a plan does, with torch copies (tests)."""
    for d, s in zip(dst, src):
        d.copy_(s)
