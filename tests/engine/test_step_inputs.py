"""Runner step inputs: the vectorised builder equals the reference context builders, and CUDA-graph buckets.

The reference is layers.context.prefill_context / decode_context (the per-token Python builders the runner
used before); same batches, same tensors. The graph capture itself needs CUDA (tests/engine/test_engine_gpu.py).
"""

from __future__ import annotations

import random

import pytest
import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.cuda_graphs import graph_batch_sizes
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import Sequence
from multilora_cli.engine.step_inputs import build_step_inputs
from multilora_cli.layers.context import decode_context, prefill_context

BS = 4


def _batch(rng: random.Random, n: int, decode: bool) -> ScheduledBatch:
    seqs, new, start = [], [], []
    free = list(range(1000))
    rng.shuffle(free)
    for i in range(n):
        prompt = [rng.randrange(3, 100) for _ in range(rng.randrange(1, 40))]
        seq = Sequence(seq_id=i, request=Request(key=i, id=str(i), sampling=SamplingParams()), prompt_token_ids=prompt)
        done = len(prompt) - 1 if decode else rng.randrange(0, len(prompt))  # cached prefix (chunked prefill)
        todo = 1 if decode else rng.randrange(1, len(prompt) - done + 1)
        seq.num_computed_tokens = done
        seq.block_table = [free.pop() for _ in range(-(-(done + todo) // BS))]
        seqs.append(seq)
        new.append(todo)
        start.append(done)
    return ScheduledBatch(
        seqs=seqs,
        num_new_tokens=new,
        start=start,
        slots=[-1] * n,
        sample=[st + k == s.num_tokens for s, st, k in zip(seqs, start, new)],
        num_decodes=n if decode else 0,
        block_size=BS,
    )


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_vectorised_inputs_equal_reference_builders(decode, seed):
    batch = _batch(random.Random(seed), 1 + seed * 3, decode)
    got = build_step_inputs(batch, torch.device("cpu"))
    if decode:
        want = decode_context(batch.seq_lens(), batch.block_tables(), BS)
    else:
        want = prefill_context(batch.num_new_tokens, batch.seq_lens(), batch.block_tables(), BS)
    assert got.input_ids.tolist() == batch.input_ids()
    assert got.positions.tolist() == batch.positions()
    assert got.logits_rows.tolist() == batch.logits_indices()
    ctx = got.ctx
    assert ctx.is_prefill == want.is_prefill and ctx.seqlens_q == want.seqlens_q and ctx.seqlens_k == want.seqlens_k
    assert ctx.slot_mapping.dtype == torch.int64 and ctx.slot_mapping.tolist() == want.slot_mapping.tolist()
    assert ctx.slot_mapping.tolist() == batch.kv_slot_mapping()
    assert (ctx.max_seqlen_q, ctx.max_seqlen_k) == (want.max_seqlen_q, want.max_seqlen_k)
    for name in ("cu_seqlens_q", "cu_seqlens_k", "context_lens", "block_tables"):
        a, b = getattr(ctx, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == torch.int32 and torch.equal(a, b), name


def test_graph_buckets():
    assert graph_batch_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
