"""Argument checks and grid sizing shared by the SGMV launchers (host only: never reads device data)."""

from __future__ import annotations

from functools import lru_cache

import torch

from multilora_cli.kernels.blocks import tile_index
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.weights import LoraWeights

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_GRID_TILES = 65535  # tiles sit on a CUDA grid's y / z axis


def check_x(x: torch.Tensor, features: int, name: str) -> int:
    """x: [T, features], float, unit column stride. Returns T."""
    if x.dim() != 2 or x.shape[1] != features:
        raise ValueError(f"{name} must be [T, {features}], got {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} dtype {x.dtype} not supported (fp16, bf16, fp32)")
    if x.shape[0] > 0 and x.stride(1) != 1:
        raise ValueError(f"{name} needs unit column stride, got strides {x.stride()}")
    return x.shape[0]


_CHECKED: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}


def check_weights(w: LoraWeights, device: torch.device) -> None:
    """Validate a slot pool once per (tensors, device): layouts cannot change in place, and this runs per layer
    per step. The cache holds the tensors it keys on, so an id is never reused while its entry lives."""
    key = (id(w.a), id(w.b), id(w.rank), id(w.scale), hash(device))
    if key in _CHECKED:
        return
    _check_weights(w, device)
    if len(_CHECKED) >= 64:
        _CHECKED.pop(next(iter(_CHECKED)))
    _CHECKED[key] = (w.a, w.b, w.rank, w.scale)


def _check_weights(w: LoraWeights, device: torch.device) -> None:
    for name, t in (("a", w.a), ("b", w.b)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"LoraWeights.{name} dtype {t.dtype} not supported (fp16, bf16, fp32)")
        unit = t.stride(-1) == 1 or (name == "b" and t.stride(1) == 1)  # b may be rank-major (the default)
        if not unit:
            raise ValueError(f"LoraWeights.{name} needs a unit stride along in/out or rank, got {t.stride()}")
        if t.device != device:
            raise ValueError(f"LoraWeights.{name} on {t.device}, activations on {device}")
    shape = (w.max_loras, w.n_slices)
    if w.rank.dtype != torch.int32 or tuple(w.rank.shape) != shape or not w.rank.is_contiguous():
        raise ValueError(f"LoraWeights.rank must be contiguous int32 {shape}, got {w.rank.dtype} {tuple(w.rank.shape)}")
    if w.scale.dtype != torch.float32 or tuple(w.scale.shape) != shape or not w.scale.is_contiguous():
        raise ValueError(
            f"LoraWeights.scale must be contiguous fp32 {shape}, got {w.scale.dtype} {tuple(w.scale.shape)}"
        )
    if w.rank.device != device or w.scale.device != device:
        raise ValueError(f"LoraWeights.rank/scale on {w.rank.device}, activations on {device}")
    if len(w.slice_offsets) != w.n_slices + 1 or w.slice_offsets[-1] != w.out_features:
        raise ValueError(f"LoraWeights.slice_offsets {w.slice_offsets} do not match b {tuple(w.b.shape)}")


def check_meta(meta: LoraMeta, t: int, device: torch.device) -> None:
    if meta.num_tokens != t or meta.sorted_idx.shape[0] != t:
        raise ValueError(f"LoraMeta is for {meta.num_tokens} tokens, activations have {t}")
    if meta.tiles is None or len(meta.tile_counts) != meta.tiles.shape[0]:
        raise ValueError("LoraMeta has no tile map: build it with build_lora_meta or LoraMetaBuffers")
    if meta.tiles.device != device or meta.sorted_idx.device != device:
        raise ValueError(f"LoraMeta on {meta.tiles.device}, activations on {device}")


def rank_bucket(max_rank: int) -> int:
    """Largest rank bucket a kernel compiles for a pool: pow2 >= max_rank, at least 16 (tensor-core minimum);
    anything above 64 compiles the chunked path."""
    return max(16, 1 << (max_rank - 1).bit_length())


def capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def tile_grid(meta: LoraMeta, bm: int, t: int, max_loras: int, max_tiles: int = MAX_GRID_TILES) -> int:
    """Number of tile CTAs to launch. Eager: the real count (host-known). Under CUDA-graph capture: the static
    bound cdiv(T, bm) + min(max_loras, T), so any later adapter mix fits; padding tiles exit at once. More than
    `max_tiles` (the grid axis' limit) is a ValueError that says how to split the batch."""
    if capturing(meta.tiles.device):
        if not meta.static:
            raise ValueError("capturing a CUDA graph needs LoraMeta from LoraMetaBuffers (persistent buffers)")
        n = min(meta.tiles.shape[2], -(-t // bm) + min(max_loras, t))
    else:
        n = meta.tile_counts[tile_index(bm)]
    if n > max_tiles:
        raise ValueError(
            f"{n} LoRA tiles exceed the grid's tile axis ({max_tiles}): split the batch "
            f"(fewer tokens per step, e.g. a smaller max_num_batched_tokens)"
        )
    return n


@lru_cache(maxsize=16)
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """SM count of a CUDA device; a small stand-in elsewhere (interpreter), keeping its grids small."""
    if device.type != "cuda":
        return 4
    return _sms(device.index if device.index is not None else torch.cuda.current_device())
