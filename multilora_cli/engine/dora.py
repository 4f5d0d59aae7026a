"""DoRA's per-output-feature scale g = m / ||W + s·B·A||_row, computed once when an adapter enters a slot.

PEFT (peft/tuners/lora/dora.py `get_weight_norm`) takes the L2 norm of each output feature's row of the adapted
weight W + s·B·A (W: [out, in] as nn.Linear stores it, so fan_in_fan_out never applies to the served layers) and
detaches it: at inference it is a constant per (adapter, output feature), exactly what a slot can hold. Here it
is computed on the slot's device from the slot's own A / B (what the step multiplies with) and the base W, in
float32, expanded so a load reads W once and never materialises W + s·B·A:
    ||W_o + s·(BA)_o||² = ||W_o||² + 2s · B_o · (W Aᵀ)_o + s² · B_o (A Aᵀ) B_oᵀ
||W_o||² is computed once per run. Each packed slice (q | k | v, gate | up) gets its own rows; slices the adapter
does not adapt with DoRA, and plain-LoRA adapters, keep g = 1.

`DoraNorms` does a load in a few batched ops with no host sync (it runs on the slot writer's load stream):
- the scale rows of every module are column ranges of ONE [max_loras + 1, total] float32 tensor, grouped by
  module kind (all q|k|v of the model, then all o, ...), so a slot's row is one contiguous vector;
- the magnitudes arrive as one float32 row in that column layout (NaN = no magnitude: g = 1 there), gathered on
  the device from the packed buffer that brought A / B (engine/packed.py), or built on the host for unpacked ones;
- per kind, the layers are stacked: the A Aᵀ term of all slices and layers is one batched matmul, over the
  slot's whole rank-padded A and B with a mask that keeps each row's own slice and rank (so every slice of every
  layer of a kind is one set of ops); only W Aᵀ is one GEMM per module (W is not stacked: it is read in place).
"""

from __future__ import annotations

import math

import torch

from multilora_cli.adapters.peft import SLICES
from multilora_cli.errors import EngineError

_CHUNK_ELEMS = 1 << 24  # rows per chunk * in_features: 64 MiB of float32 temporaries
_STACK_ELEMS = 1 << 24  # float32 temporaries of one stacked batch of layers (x ~3 live at once)


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


def _wa(weight: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """W Aᵀ [out, r] float32 with W [out, in] read once in its own dtype (CUDA: a bf16 GEMM with a float32 output).
    a: [r, in], any floating dtype (the slot's: equal to W's on a bf16 / fp16 base, so the cast is exact)."""
    if weight.dtype == torch.float32:
        return weight @ a.float().T
    if weight.is_cuda:
        try:
            return torch.mm(weight, a.T.to(weight.dtype), out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # an older torch: the float32 chunks below
            pass
    a32 = a.float()
    out, fin = weight.shape
    wa = torch.empty(out, a.shape[0], dtype=torch.float32, device=weight.device)
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
    """g [out] float32 = m / ||weight + scaling · b @ a|| per row, for one slice: the formula `DoraNorms` batches.
    weight: [out, in], a: [r, in], b: [out, r], m: [out], w_sq: `row_norms_sq(weight)` when cached.
    In float32 the terms are of the size of the result (the delta is a small correction to W), so this agrees
    with PEFT's direct norm to float32 rounding (tests/models/test_model_dora.py)."""
    a32, b32 = a.float(), b.float()
    if w_sq is None:
        w_sq = row_norms_sq(weight)
    cross = (b32 * _wa(weight, a32)).sum(1)  # [out]
    delta_sq = ((b32 @ (a32 @ a32.T)) * b32).sum(1)  # [out]
    norm = (w_sq + (2.0 * scaling) * cross + (scaling * scaling) * delta_sq).clamp_min(0.0).sqrt()
    return m.to(device=weight.device, dtype=torch.float32) / norm


class _Kind:
    """Modules of one shape (e.g. every layer's q|k|v): their columns [lo, hi) of the scale rows, layer-major."""

    def __init__(self, keys: list, modules: list, lo: int, device: torch.device):
        w = modules[0].lora
        self.keys, self.modules, self.lo = keys, modules, lo
        self.out, self.n, self.rank = w.out_features, w.n_slices, w.max_rank
        self.hi = lo + len(modules) * self.out
        offs = w.slice_offsets
        # slice of each output row [out], and (slice, rank index) of each column of the rank-padded A of a slot
        self.row_slice = torch.cat(
            [torch.full((offs[i + 1] - offs[i],), i, dtype=torch.long) for i in range(self.n)]
        ).to(device)
        cols = torch.arange(self.n * self.rank)
        self.col_slice, self.col_rank = (cols // self.rank).to(device), (cols % self.rank).to(device)
        self.w_sq = torch.stack([row_norms_sq(m.weight) for m in modules])  # [L, out], once per run
        per_layer = self.n * self.rank * (w.in_features + 3 * self.out)
        self.chunk = max(1, _STACK_ELEMS // per_layer)  # layers per batch of stacked ops


class DoraNorms:
    """The DoRA scale rows of `modules` ([((layer, fused), LoRALinear)]) and their computation per slot load."""

    def __init__(self, modules: list, device: torch.device):
        kinds: dict[tuple, list] = {}
        for key, m in modules:
            w = m.lora
            shape = (key[1], w.n_slices, w.max_rank, w.in_features, w.slice_offsets, m.weight.dtype)
            kinds.setdefault(shape, []).append((key, m))
        max_loras = modules[0][1].lora.max_loras if modules else 0
        total = sum(m.lora.out_features for _, m in modules)
        # ones: every slot a plain LoRA until a DoRA adapter is installed; row max_loras = the base's
        self.rows = torch.ones(max_loras + 1, total, dtype=torch.float32, device=device)
        self.kinds: list[_Kind] = []
        self.cols: dict[tuple[int, str], tuple[int, int]] = {}  # (layer, PEFT module) -> its columns
        lo = 0
        for members in kinds.values():
            kind = _Kind([k for k, _ in members], [m for _, m in members], lo, device)
            for (layer, fused), m in members:
                m.lora.dora = self.rows[:, lo : lo + kind.out]  # a view: kernels read row stride, unit columns
                offs = m.lora.slice_offsets
                for i, name in enumerate(SLICES[fused]):
                    self.cols[(layer, name)] = (lo + offs[i], lo + offs[i + 1])
                lo += kind.out
            self.kinds.append(kind)
        self.total = total
        self.device = device

    def host_row(self, magnitudes: dict) -> torch.Tensor:
        """The magnitudes {(layer, PEFT module): m [out]} as one float32 row in the column layout (NaN elsewhere),
        on the host (for adapters that are not packed: the CPU's, MoE's)."""
        row = torch.full((self.total,), math.nan, dtype=torch.float32)
        for key, m in magnitudes.items():
            cols = self.cols.get(key)
            if cols is None:
                raise EngineError(
                    f"DoRA magnitude for layer {key[0]} {key[1]}, which has no LoRA module here",
                    hint="this is a bug: pre-flight refuses adapters on modules the model does not have",
                )
            row[cols[0] : cols[1]] = m
        return row

    def packed_index(self, mags: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """For a packed layout's magnitudes ((key, float offset, out), ...): (source index [total] long, valid
        [total] bool) on the device, so that row = where(valid, region[index], nan) (cache it per layout)."""
        idx = torch.zeros(self.total, dtype=torch.long)
        valid = torch.zeros(self.total, dtype=torch.bool)
        for key, off, out in mags:
            cols = self.cols.get(key)
            if cols is None or cols[1] - cols[0] != out:
                raise EngineError(
                    f"DoRA magnitude for layer {key[0]} {key[1]} ({out} features) does not fit this model",
                    hint="this is a bug: pre-flight checks every adapter's shapes against the base",
                )
            idx[cols[0] : cols[1]] = torch.arange(off, off + out)
            valid[cols[0] : cols[1]] = True
        return idx.to(self.device), valid.to(self.device)

    def write(self, slot: int, m_row: torch.Tensor | None) -> None:
        """Fill row `slot` from the slot's A / B / rank / scale (installed before, on the same stream) and the
        magnitudes m_row [total] float32 on the device (NaN: g = 1); None (a plain LoRA): all ones."""
        if m_row is None:
            self.rows[slot].fill_(1.0)
            return
        for kind in self.kinds:
            for lo in range(0, len(kind.modules), kind.chunk):
                self._write_layers(slot, kind, lo, min(len(kind.modules), lo + kind.chunk), m_row)

    def _write_layers(self, slot: int, kind: _Kind, lo: int, hi: int, m_row: torch.Tensor) -> None:
        ws = [m.lora for m in kind.modules[lo:hi]]
        layers, n, r, out = hi - lo, kind.n, kind.rank, kind.out
        a = torch.stack([w.a[slot] for w in ws]).reshape(layers, n * r, -1)  # [L, nR, in] slot dtype
        a32 = a.float()
        gram = a32 @ a32.transpose(1, 2)  # [L, nR, nR]: A Aᵀ of every slice at once (cross-slice terms masked)
        b = torch.stack([w.b[slot] for w in ws]).float()  # [L, out, R]
        ranks = torch.stack([w.rank[slot] for w in ws])[:, kind.row_slice]  # [L, out] int32: the row's slice rank
        scale = torch.stack([w.scale[slot] for w in ws])[:, kind.row_slice]  # [L, out] float32
        # each row keeps its own slice's first `rank` columns of the rank-padded [nR] axis: stale rows past the
        # rank (a previous adapter's) and other slices' columns are multiplied by 0
        keep = (kind.col_slice == kind.row_slice[:, None]) & (kind.col_rank < ranks[:, :, None])  # [L, out, nR]
        bx = b.repeat(1, 1, n) * keep  # [L, out, nR]
        delta = ((bx @ gram) * bx).sum(-1)  # [L, out] = B_o (A Aᵀ) B_oᵀ
        cross = torch.stack(
            [torch.linalg.vecdot(bx[i], _wa(m.weight, a[i])) for i, m in enumerate(kind.modules[lo:hi])]
        )  # [L, out] = B_o · (W Aᵀ)_o
        norm = (kind.w_sq[lo:hi] + 2.0 * scale * cross + scale * scale * delta).clamp_min(0.0).sqrt()
        c0, c1 = kind.lo + lo * out, kind.lo + hi * out
        m = m_row[c0:c1].view(layers, out)
        self.rows[slot, c0:c1] = torch.where(torch.isnan(m), 1.0, m / norm).reshape(-1)
