"""Per-step LoRA metadata: built once per step on the host, shared by every LoRA layer of the model.

The scheduler knows each token's slot on the host, so grouping and tiling are host work followed by one
host-to-device copy; the per-layer kernels then never sync with the host. `LoraMetaBuffers` writes into
persistent device tensors so a CUDA graph captured once can be replayed with next step's batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Row-block sizes the kernels may pick (see blocks.py); a tile map is built for each.
TILE_BLOCKS: tuple[int, ...] = (16, 32, 64, 128)


@dataclass(slots=True)
class LoraMeta:
    """Tokens grouped by adapter slot.

    token_slot: [T] int32   slot of each token, -1 = base only
    sorted_idx: [T] int32   token indices stable-sorted by slot (base tokens last)
    seg_start:  [S+1] int32 segment boundaries into sorted_idx (adapted tokens only)
    seg_slot:   [S] int32   slot of each segment
    segments:   host copy [(slot, start, end)], for the CPU path (no device sync needed there)
    tiles:      [len(TILE_BLOCKS), 3, cap] int32  per row-block size BM: the work tiles of the kernels,
                (slot, lo, hi) = one segment's rows sorted_idx[lo:hi], hi - lo <= BM; slot -1 = no work
    tile_counts: host, number of real tiles per BM (eager launches size their grid by it)
    static:     True when the tensors are views of persistent buffers (`LoraMetaBuffers`): safe to capture
    num_adapted: [1] int32  adapted tokens (= seg_start[S]) at a fixed address: sorted_idx[num_adapted:] are
                the base tokens, which kernels covering every row (sgmv_silu.py) find there inside a graph
    """

    token_slot: torch.Tensor
    sorted_idx: torch.Tensor
    seg_start: torch.Tensor
    seg_slot: torch.Tensor
    segments: list[tuple[int, int, int]]
    tiles: torch.Tensor | None = None
    tile_counts: tuple[int, ...] = ()
    static: bool = False
    num_adapted: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.token_slot.shape[0]

    @property
    def any_lora(self) -> bool:
        return bool(self.segments)


def tile_capacity(num_tokens: int, max_segments: int) -> int:
    """Upper bound on tiles for the smallest BM: each segment adds at most one partial tile."""
    return -(-num_tokens // TILE_BLOCKS[0]) + min(max_segments, num_tokens)


def expand_counts(per: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts per[i]: (owner, index) of every item when item j of group i is listed in order, i.e.
    owner = [0]*per[0] + [1]*per[1] + ..., index = [0..per[0]) + [0..per[1]) + ... (tiles per segment,
    chunks per block)."""
    owner = np.repeat(np.arange(len(per)), per)
    return owner, np.arange(len(owner)) - np.repeat(np.cumsum(per) - per, per)


def group_tokens(slots) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """Stable sort of token indices by slot (base tokens last) and the segments [(slot, start, end)].

    numpy, not Python loops: this runs on the step loop (~1 ms in Python for 256 tokens, ~50 us here)."""
    s = np.asarray(slots, dtype=np.int64).reshape(-1)
    order = np.argsort(np.where(s >= 0, s, 1 << 40), kind="stable")
    ss = s[order][: int((s >= 0).sum())]  # adapted tokens' slots, grouped
    if ss.size == 0:
        return order, []
    starts = np.flatnonzero(np.concatenate(([True], ss[1:] != ss[:-1])))
    ends = np.append(starts[1:], ss.size)
    return order, list(zip(ss[starts].tolist(), starts.tolist(), ends.tolist()))


def tile_rows(segments: list[tuple[int, int, int]], cap: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Host tile table [len(TILE_BLOCKS), 3, cap] int32 (slot row, lo row, hi row per BM; slot -1 = padding)
    and the real tile count per BM."""
    out = np.zeros((len(TILE_BLOCKS), 3, cap), dtype=np.int32)
    out[:, 0, :] = -1
    counts = []
    if not segments:
        return out, (0,) * len(TILE_BLOCKS)
    seg = np.asarray(segments, dtype=np.int64)  # [S, 3]: slot, start, end
    for i, bm in enumerate(TILE_BLOCKS):
        per = -(-(seg[:, 2] - seg[:, 1]) // bm)  # tiles per segment
        n = int(per.sum())
        assert n <= cap, (n, cap)
        which, k = expand_counts(per)  # segment of each tile, tile index within its segment
        lo = seg[which, 1] + k * bm
        out[i, 0, :n] = seg[which, 0]
        out[i, 1, :n] = lo
        out[i, 2, :n] = np.minimum(lo + bm, seg[which, 2])
        counts.append(n)
    return out, tuple(counts)


def build_lora_meta(token_slot: list[int] | torch.Tensor, device: torch.device | str = "cpu") -> LoraMeta:
    """Group tokens by slot. `token_slot` is host data (the scheduler knows it), so no device sync.

    Fresh tensors each call: fine for eager steps; for CUDA graphs use `LoraMetaBuffers`.
    """
    slots = np.asarray(
        token_slot.tolist() if isinstance(token_slot, torch.Tensor) else token_slot, dtype=np.int32
    ).reshape(-1)
    order, segments = group_tokens(slots)
    starts = [seg[1] for seg in segments] + ([segments[-1][2]] if segments else [0])
    cap = max(tile_capacity(len(slots), len(segments)), 1)
    tiles, counts = tile_rows(segments, cap)
    mk = lambda v: torch.as_tensor(np.asarray(v, dtype=np.int32)).to(device, non_blocking=True)  # noqa: E731
    return LoraMeta(
        token_slot=mk(slots),
        sorted_idx=mk(order),
        seg_start=mk(starts),
        seg_slot=mk([seg[0] for seg in segments]),
        segments=segments,
        tiles=mk(tiles),
        tile_counts=counts,
        num_adapted=mk([starts[-1]]),
    )


class LoraMetaBuffers:
    """Fixed-capacity device buffers for `LoraMeta`, reused every step (CUDA-graph safe).

    `build(token_slot)` fills a pinned host staging buffer and issues ONE non-blocking copy into a
    persistent device buffer; the returned LoraMeta's tensors are views at fixed addresses, so a graph
    captured with one batch replays correctly with the next (same T, any adapter mix).
    """

    def __init__(self, max_tokens: int, max_loras: int, device: torch.device | str):
        if max_tokens < 1 or max_loras < 1:
            raise ValueError(f"LoraMetaBuffers needs max_tokens >= 1 and max_loras >= 1, got {max_tokens}, {max_loras}")
        self.max_tokens, self.max_loras = max_tokens, max_loras
        self.device = torch.device(device)
        # a step has at most min(slots, tokens) segments: past max_tokens slots, the buffers (and the one copy a
        # step makes of them) no longer grow with the pool
        segs = min(max_loras, max_tokens)
        self.cap = tile_capacity(max_tokens, segs)
        # flat layout: token_slot | sorted_idx | seg_start | seg_slot | num_adapted | tiles
        self._off = [0, max_tokens, 2 * max_tokens, 2 * max_tokens + segs + 1]
        self._off.append(self._off[-1] + segs)
        self._off.append(self._off[-1] + 1)
        total = self._off[-1] + len(TILE_BLOCKS) * 3 * self.cap
        pin = self.device.type == "cuda"
        self._host = torch.empty(total, dtype=torch.int32, pin_memory=pin)
        self._host_np = self._host.numpy()
        self._dev = torch.zeros(total, dtype=torch.int32, device=self.device)
        self._copied = torch.cuda.Event() if pin else None

    def build(self, token_slot: list[int]) -> LoraMeta:
        """Write this step's metadata into the buffers and return views of them (no host sync)."""
        slots = np.asarray(token_slot, dtype=np.int32).reshape(-1)
        t = len(slots)
        if t > self.max_tokens:
            raise ValueError(f"{t} tokens exceed LoraMetaBuffers capacity {self.max_tokens}")
        order, segments = group_tokens(slots)
        if len(segments) > self.max_loras:
            raise ValueError(f"{len(segments)} distinct slots exceed LoraMetaBuffers max_loras {self.max_loras}")
        starts = [seg[1] for seg in segments] + ([segments[-1][2]] if segments else [0])
        tiles, counts = tile_rows(segments, self.cap)
        o = self._off
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has long finished; never overwrite it mid-flight
        h = self._host_np
        h[o[0] : o[0] + t] = slots
        h[o[1] : o[1] + t] = order
        h[o[2] : o[2] + len(starts)] = starts
        if segments:
            h[o[3] : o[3] + len(segments)] = [seg[0] for seg in segments]
        h[o[4]] = starts[-1]
        h[o[5] :] = tiles.reshape(-1)
        self._dev.copy_(self._host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        d = self._dev
        return LoraMeta(
            token_slot=d[o[0] : o[0] + t],
            sorted_idx=d[o[1] : o[1] + t],
            seg_start=d[o[2] : o[2] + len(starts)],
            seg_slot=d[o[3] : o[3] + len(segments)],
            segments=segments,
            tiles=d[o[5] :].view(len(TILE_BLOCKS), 3, self.cap),
            tile_counts=counts,
            static=True,
            num_adapted=d[o[4] : o[4] + 1],
        )
