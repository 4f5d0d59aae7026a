"""`LoraWeights`: the stacked slot tensors one LoRA-wrapped (possibly fused) linear layer owns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LoraWeights:
    """Slot-major stacked adapter weights of one linear layer with `n_slices` packed output slices.

    a:      [max_loras, n_slices, max_rank, in_features]  (weights dtype)   lora_A per slice
    b:      [max_loras, out_features, max_rank]           (weights dtype)   lora_B, slices concatenated
                                                                            along out like the fused base W;
            stored rank-major (b.stride(1) == 1, a transposed view): rank row j of a slot is one contiguous
            run over out, so a rank-r adapter's B is r contiguous rows and kernels read exactly those bytes
    rank:   [max_loras, n_slices] int32    real rank of (slot, slice); 0 = slice not adapted by that slot
    scale:  [max_loras, n_slices] float32  lora_alpha / r (or / sqrt(r)) of (slot, slice)
    slice_offsets: n_slices + 1 column offsets of each slice in the output (host ints)
    dora:   [max_loras + 1, out_features] float32 or None: DoRA's m / ||W + s·B·A|| per (slot, output feature),
            ones for plain-LoRA slots and for the last row (the base, slot -1); None = no DoRA in this run
            (`enable_dora` allocates it; kernels/dora.py applies it)
    Rows/cols past `rank` are never read (rank-aware), so evicting a slot needs no zeroing.
    """

    a: torch.Tensor
    b: torch.Tensor
    rank: torch.Tensor
    scale: torch.Tensor
    slice_offsets: tuple[int, ...]
    dora: torch.Tensor | None = None

    def enable_dora(self) -> None:
        """Allocate the DoRA scale rows (all ones: every slot a plain LoRA until a DoRA adapter is installed)."""
        if self.dora is None:
            self.dora = torch.ones(self.max_loras + 1, self.out_features, dtype=torch.float32, device=self.a.device)

    @classmethod
    def empty(
        cls,
        max_loras: int,
        max_rank: int,
        in_features: int,
        slice_sizes: list[int] | tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> LoraWeights:
        offs = [0]
        for n in slice_sizes:
            offs.append(offs[-1] + n)
        return cls(
            a=torch.zeros(max_loras, len(slice_sizes), max_rank, in_features, dtype=dtype, device=device),
            # [L, R, out] storage viewed as [L, out, R]: rank-aware reads stay contiguous and vectorisable
            b=torch.zeros(max_loras, max_rank, offs[-1], dtype=dtype, device=device).transpose(1, 2),
            rank=torch.zeros(max_loras, len(slice_sizes), dtype=torch.int32, device=device),
            scale=torch.zeros(max_loras, len(slice_sizes), dtype=torch.float32, device=device),
            slice_offsets=tuple(offs),
        )

    @property
    def max_loras(self) -> int:
        return self.a.shape[0]

    @property
    def n_slices(self) -> int:
        return self.a.shape[1]

    @property
    def max_rank(self) -> int:
        return self.a.shape[2]

    @property
    def in_features(self) -> int:
        return self.a.shape[3]

    @property
    def out_features(self) -> int:
        return self.b.shape[1]

    def set_slot(self, slot: int, slices: list[tuple[torch.Tensor, torch.Tensor, float] | None]) -> None:
        """Copy one adapter into `slot`. slices[i] = (A [r, in], B [n_i, r], scaling) or None (not adapted)."""
        assert len(slices) == self.n_slices
        for i, item in enumerate(slices):
            if item is None:
                self.rank[slot, i] = 0
                self.scale[slot, i] = 0.0
                continue
            a, b, scaling = item
            r = a.shape[0]
            lo, hi = self.slice_offsets[i], self.slice_offsets[i + 1]
            if r > self.max_rank or a.shape[1] != self.in_features or tuple(b.shape) != (hi - lo, r):
                raise ValueError(f"slice {i}: A {tuple(a.shape)} / B {tuple(b.shape)} do not fit this layer")
            self.a[slot, i, :r].copy_(a, non_blocking=True)
            self.b[slot, lo:hi, :r].copy_(b, non_blocking=True)
            self.rank[slot, i] = r
            self.scale[slot, i] = float(scaling)

    def clear_slot(self, slot: int) -> None:
        """Forget the adapter in `slot` (rank 0 everywhere; weights left as they are)."""
        self.rank[slot].zero_()
        self.scale[slot].zero_()
        if self.dora is not None:
            self.dora[slot].fill_(1.0)
