"""Eager step inputs: a `ScheduledBatch` -> token ids, positions, `StepContext` and logits rows, vectorised.

Everything the step needs on the device is packed into ONE int64 host array and moved with one copy, then
split into views (int32 casts on the device where the kernels' contract asks for int32). Per-token work is
numpy (a large prefill chunk is thousands of tokens; Python loops over them cost milliseconds per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.layers.context import StepContext


@dataclass(slots=True)
class StepInputs:
    """input_ids / positions: [T] long; logits_rows: [N] long (one per sampled sequence); ctx: the context."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_rows: torch.Tensor
    ctx: StepContext
    num_logits: int


def kv_slots(batch: ScheduledBatch) -> np.ndarray:
    """[T] int64 flat cache slot of every fed token (block_id * block_size + offset)."""
    bs = batch.block_size
    parts = []
    for seq, s, n in zip(batch.seqs, batch.start, batch.num_new_tokens):
        if n == 1:
            parts.append(np.array([seq.block_table[s // bs] * bs + s % bs], dtype=np.int64))
            continue
        first, last = s // bs, (s + n - 1) // bs
        table = np.asarray(seq.block_table[first : last + 1], dtype=np.int64)
        pos = np.arange(s, s + n, dtype=np.int64)
        parts.append(table[pos // bs - first] * bs + pos % bs)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def positions_of(batch: ScheduledBatch) -> np.ndarray:
    """[T] int64 position of every fed token."""
    if batch.is_decode_only:
        return np.asarray(batch.start, dtype=np.int64)
    return np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(batch.start, batch.num_new_tokens)])


def padded_tables(batch: ScheduledBatch) -> np.ndarray:
    """[B, max blocks] int64 block tables, zero-padded (pad entries are never read)."""
    tables = [seq.block_table for seq in batch.seqs]
    width = max((len(t) for t in tables), default=0) or 1
    out = np.zeros((len(tables), width), dtype=np.int64)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


def build_step_inputs(batch: ScheduledBatch, device: torch.device, lora: LoraMeta | None = None) -> StepInputs:
    """One host->device copy of every index the eager step needs; the context layout of `layers.context`."""
    q = np.asarray(batch.num_new_tokens, dtype=np.int64)
    k = np.asarray(batch.start, dtype=np.int64) + q  # context length after this step
    cu_q = np.concatenate([[0], np.cumsum(q)])
    rows = (cu_q[1:] - 1)[np.asarray(batch.sample, dtype=bool)]
    decode = batch.is_decode_only
    prefix = decode or bool((k > q).any())
    tables = padded_tables(batch) if prefix else np.zeros((0, 1), dtype=np.int64)
    ids = np.asarray(batch.input_ids(), dtype=np.int64)
    parts = [
        ids,
        positions_of(batch),
        kv_slots(batch),
        rows,
        cu_q,
        np.concatenate([[0], np.cumsum(k)]),
        k,
        tables.ravel(),
    ]
    flat = torch.from_numpy(np.concatenate(parts))
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    views, off = [], 0
    for p in parts:
        views.append(flat[off : off + p.shape[0]])
        off += p.shape[0]
    t_ids, t_pos, t_slots, t_rows, t_cuq, t_cuk, t_k, t_tab = views
    seqlens_q, seqlens_k = q.tolist(), k.tolist()
    block_tables = t_tab.view(tables.shape).to(torch.int32) if prefix else None
    if decode:
        ctx = StepContext(
            is_prefill=False,
            slot_mapping=t_slots,
            seqlens_q=seqlens_q,
            seqlens_k=seqlens_k,
            max_seqlen_q=1,
            max_seqlen_k=int(k.max(initial=0)),
            context_lens=t_k.to(torch.int32),
            block_tables=block_tables,
            lora=lora,
        )
    else:
        ctx = StepContext(
            is_prefill=True,
            slot_mapping=t_slots,
            seqlens_q=seqlens_q,
            seqlens_k=seqlens_k,
            cu_seqlens_q=t_cuq.to(torch.int32),
            cu_seqlens_k=t_cuk.to(torch.int32),
            max_seqlen_q=int(q.max(initial=0)),
            max_seqlen_k=int(k.max(initial=0)),
            block_tables=block_tables,
            lora=lora,
        )
    return StepInputs(input_ids=t_ids, positions=t_pos, logits_rows=t_rows, ctx=ctx, num_logits=int(rows.shape[0]))
