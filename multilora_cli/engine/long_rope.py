"""LongRoPE (Phi-3) in a batched engine, with transformers' `generate` semantics exactly.

transformers picks the short or the long factors per forward: long when the forward's sequence is longer than
original_max_position_embeddings (L0). Its Phi-3 `generate` keeps the KV cache consistent with that: the step whose
input reaches L0 + 1 tokens drops the cache and recomputes the whole sequence with the long factors. So at every
step a sequence's whole KV is what one forward of all its tokens gives: short while it has at most L0 tokens, long
once it has more. Here:
- a token fed in a step is rotated long when its position is >= L0 (every decode past L0) or its sequence already
  holds more than L0 tokens (a prompt longer than L0, or a recompute after preemption): `long_mask`, which is
  None when the position rule alone is exact (the model applies that rule itself, so decode graphs need nothing);
- the decode step that feeds position L0 of a sequence whose first L0 tokens were rotated short (its prompt had at
  most L0 tokens) is preceded by a recompute of those L0 positions with the long factors into the same KV slots,
  through the sequence's LoRA slot (`crossings` finds them; the runner runs them, engine/runner.py).
"""

from __future__ import annotations

import numpy as np

from multilora_cli.engine.batch import ScheduledBatch


def long_mask(batch: ScheduledBatch, long_from: int | None) -> np.ndarray | None:
    """[T] bool: the fed tokens rotated with the long factors, or None when that is exactly position >= long_from
    for every token (no sequence longer than long_from feeds a position below it)."""
    if long_from is None:
        return None
    needed = any(seq.num_tokens > long_from and s < long_from for seq, s in zip(batch.seqs, batch.start))
    if not needed:
        return None
    parts = [
        np.full(n, True) if seq.num_tokens > long_from else np.arange(s, s + n) >= long_from
        for seq, s, n in zip(batch.seqs, batch.start, batch.num_new_tokens)
    ]
    return np.concatenate(parts)


def crossings(batch: ScheduledBatch, long_from: int | None) -> list[int]:
    """Indices (into batch.seqs) of sequences whose step feeds position long_from as a decode, after long_from
    tokens computed with the short factors: their KV must be recomputed long first."""
    if not long_from:
        return []
    return [
        i
        for i, (seq, s, n) in enumerate(zip(batch.seqs, batch.start, batch.num_new_tokens))
        if s == long_from and n == 1 and seq.num_prompt_tokens <= long_from
    ]


def recompute_batches(batch: ScheduledBatch, index: int, long_from: int, max_tokens: int) -> list[ScheduledBatch]:
    """Prefill chunks (at most max_tokens each, nothing sampled) recomputing positions [0, long_from) of
    batch.seqs[index] in its LoRA slot; each chunk reads the ones before it from the cache."""
    seq, slot = batch.seqs[index], batch.slots[index]
    if len(seq.token_ids) < long_from:
        raise RuntimeError(f"internal: LongRoPE recompute of {seq!r} lacks its first {long_from} tokens")
    out = []
    for start in range(0, long_from, max(1, max_tokens)):
        n = min(max_tokens, long_from - start)
        out.append(ScheduledBatch([seq], [n], [start], [slot], [False], 1 if n == 1 else 0, batch.block_size))
    return out
