"""CUDA graphs of the decode forward at bucketed batch sizes.

A decode step of B sequences runs the graph captured for the smallest bucket >= B. Every input the graph
reads lives in static device buffers (token ids, positions, KV slots, context lengths, block tables: one
int32 buffer filled by ONE host->device copy per step; LoRA metadata in the runner's `LoraMetaBuffers`).
Rows B..bucket-1 are padding: KV slot -1 (nothing stored), context length 0 (attention reads nothing),
LoRA slot -1 (no adapter). The attention split is sized for `max_model_len` at capture, so any later context
fits. Graphs are captured largest first into one shared memory pool; the LM head and sampling run eagerly on
the B real rows.

Lazy capture (`lazy=True`, the engine's default): nothing is captured at start; a bucket's graph is captured the
first time a decode step needs it (warm-up forward, capture, then the replay), so start-up pays for no graph
and a run captures only the buckets it reaches. A capture synchronizes the device first (torch.cuda.graph does),
so a step still in flight has finished before the static buffers are rewritten for the warm-up.
"""

from __future__ import annotations

import time

import torch

from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.kernels.meta import LoraMetaBuffers
from multilora_cli.layers.context import StepContext, reset_context, set_context


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Buckets 1, 2, 4, 8, then every 16 up to max_num_seqs (which is always a bucket)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class DecodeGraphs:
    """Captured decode forwards of `model` plus the static buffers they read.

    model:        the LlamaForCausalLM (KV cache already allocated)
    max_num_seqs: largest decode batch (largest bucket)
    max_model_len / block_size: size the block-table width and the attention split
    lora_buffers: the runner's LoraMetaBuffers, or None without LoRA; whoever else writes them (the runner's
                  eager steps) sets `lora_key = None`
    """

    def __init__(
        self,
        model,
        *,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        lora_buffers: LoraMetaBuffers | None,
        device: torch.device,
        lazy: bool = False,
    ):
        self.model = model
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.width = -(-max_model_len // block_size)  # block-table columns
        self.lora_buffers = lora_buffers
        n = self.max_bs
        # flat int32 layout: ids[n] | positions[n] | kv slots[n] | context lens[n] | block tables[n, width]
        self._off = [0, n, 2 * n, 3 * n, 4 * n]
        total = 4 * n + n * self.width
        self._host = torch.zeros(total, dtype=torch.int32, pin_memory=True)
        self._np = self._host.numpy()
        self._dev = torch.zeros(total, dtype=torch.int32, device=device)
        self._copied = torch.cuda.Event()
        self._copied.record()
        self.lora_key: tuple[int, ...] | None = None  # token slots the LoRA buffers hold (None = unknown)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [bucket, hidden] final-normed hidden states
        self.pool = None
        self.lazy = lazy
        self.capture_seconds = 0.0  # spent capturing so far (at start, or inside steps when lazy)

    # --- buffers ---------------------------------------------------------------------------------------------
    def _views(self, bs: int) -> tuple[torch.Tensor, ...]:
        d, o = self._dev, self._off
        tables = d[o[4] : o[4] + bs * self.width].view(bs, self.width)
        return d[o[0] : o[0] + bs], d[o[1] : o[1] + bs], d[o[2] : o[2] + bs], d[o[3] : o[3] + bs], tables

    def _context(self, bs: int, lora) -> StepContext:
        _, _, slots, lens, tables = self._views(bs)
        return StepContext(
            is_prefill=False,
            slot_mapping=slots,
            seqlens_q=[1] * bs,
            seqlens_k=[1] * bs,
            max_seqlen_q=1,
            max_seqlen_k=self.max_model_len,
            context_lens=lens,
            block_tables=tables,
            lora=lora,
        )

    def bucket(self, num_seqs: int) -> int | None:
        for b in self.sizes:
            if b >= num_seqs:
                return b
        return None

    def can_run(self, batch: ScheduledBatch) -> bool:
        return batch.is_decode_only and batch.num_seqs <= self.max_bs

    def _fill(self, batch: ScheduledBatch, bs: int, ids: torch.Tensor | None = None) -> None:
        """Write the batch (padded to bs rows) into the pinned staging buffer and copy it over; `ids` [B] on the
        device: the token ids of an `ahead` batch (the previous step's samples), copied in after."""
        self._copied.synchronize()  # the previous step's copy has finished before its source is rewritten
        h, o, B, bsz = self._np, self._off, batch.num_seqs, self.block_size
        start = batch.start
        h[o[0] : o[0] + B] = 0 if ids is not None else [seq.token_ids[s] for seq, s in zip(batch.seqs, start)]
        h[o[1] : o[1] + B] = start
        h[o[2] : o[2] + B] = [seq.block_table[s // bsz] * bsz + s % bsz for seq, s in zip(batch.seqs, start)]
        h[o[3] : o[3] + B] = [s + 1 for s in start]
        h[o[0] + B : o[0] + bs] = 0
        h[o[1] + B : o[1] + bs] = 0
        h[o[2] + B : o[2] + bs] = -1
        h[o[3] + B : o[3] + bs] = 0
        tables = h[o[4] : o[4] + bs * self.width].reshape(bs, self.width)
        for i, seq in enumerate(batch.seqs):
            t, d = seq.block_table, seq.num_dropped  # (entries behind a sliding window are never read: not copied)
            tables[i, d : len(t)] = t[d:] if d else t
        end = o[4] + bs * self.width
        self._dev[:end].copy_(self._host[:end], non_blocking=True)
        self._copied.record()
        if ids is not None:
            self._dev[o[0] : o[0] + B].copy_(ids)  # device to device, after the copy above in stream order

    # --- capture / replay ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self, sizes: list[int] | None = None) -> None:
        """Capture one graph per bucket of `sizes` (default: every bucket) not captured yet, largest first
        (smaller ones reuse the pool's memory)."""
        todo = [bs for bs in reversed(sizes or self.sizes) if bs not in self.graphs]
        if not todo:
            return
        t0 = time.perf_counter()
        self._copied.synchronize()  # the last step's buffer copy has left the staging buffer
        o = self._off
        self._np[:] = 0
        self._np[o[2] : o[3]] = -1  # padding rows: store nothing
        self._np[o[3] : o[4]] = 1  # warm-up attention reads one (garbage) cached token per row
        torch.cuda.synchronize(self.device)  # no step in flight reads the static buffers any more
        self._dev.copy_(self._host)
        torch.cuda.synchronize(self.device)
        try:
            for bs in todo:
                ids, pos = self._views(bs)[:2]
                set_context(self._context(bs, self._warm_lora(bs)))
                self.model(ids, pos)  # warm-up: compiles what engine/precompile.py did not, grows the allocator
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                # thread_local, not torch's default "global": in global mode a CUDA call that CUDA deems unsafe
                # during a capture (cudaEventQuery, an implicitly synchronising copy) on ANY thread fails and
                # invalidates the capture. A lazy capture runs inside a step while the prefetch threads read
                # adapters into the pinned arena (its blocks' events are queried) and stage them on their own
                # stream (engine/staging.py): a random failure of the run. Their work is on other streams, never
                # on the capturing one, so only this thread needs the check.
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    out = self.model(ids, pos)
                if self.pool is None:
                    self.pool = graph.pool()
                self.graphs[bs] = graph
                self.outputs[bs] = out
        finally:
            reset_context()
            self.lora_key = None
        torch.cuda.synchronize(self.device)
        self.capture_seconds += time.perf_counter() - t0

    def _warm_lora(self, bs: int):
        # every row on slot 0 so the LoRA kernels take their adapted path (an empty slot has rank 0: the kernels
        # exit early); the captured grid is a static bound anyway
        return self.lora_buffers.build([0] * bs) if self.lora_buffers is not None else None

    @torch.inference_mode()
    def dry_run(self) -> None:
        """Every bucket's forward once, for `kernels.launch.collect` to record its Triton launches (the caller
        holds the collect; nothing is captured)."""
        try:
            for bs in self.sizes:
                ids, pos = self._views(bs)[:2]
                set_context(self._context(bs, self._warm_lora(bs)))
                self.model(ids, pos)
        finally:
            reset_context()
            self.lora_key = None

    def run(
        self, batch: ScheduledBatch, token_slots: list[int] | None, ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Replay the bucket's graph for a decode-only batch; returns hidden states [B, hidden] (a view).
        ids: [B] token ids on the device for an `ahead` batch (see `_fill`)."""
        B = batch.num_seqs
        bs = self.bucket(B)
        if bs not in self.graphs:  # lazy: this bucket's first step (before _fill: the warm-up rewrites buffers)
            self.capture([bs])
        self._fill(batch, bs, ids)
        if self.lora_buffers is not None:
            slots = list(token_slots) if token_slots is not None else [-1] * B
            key = tuple(slots) + (-1,) * (bs - B)
            if key != self.lora_key:  # consecutive decode steps of the same batch keep their LoRA metadata
                self.lora_buffers.build(list(key))
                self.lora_key = key
        self.graphs[bs].replay()
        return self.outputs[bs][:B]
