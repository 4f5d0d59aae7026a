"""Compile the Triton kernels a run will launch before its first step, in parallel (kernels/launch.py).

A cold process (empty Triton cache: a fresh container, a new machine) compiled ~44 kernel variants one at a
time: in the warm-ups of the decode graphs and inside the first prefill steps of each size, ~15 s of a 35 s
one-shot run (benchmarks/RESULTS.md, "cold start"). Here the runner dry-runs the forwards it will run with
Triton launches recorded instead of run: every decode-graph bucket, and one prefill step per token bucket of
the kernel tables (`kernels.blocks.token_bucket`) up to max_num_batched_tokens, without and with a cached
prefix, and one sampling launch (kernels/sample.py) on the model's logits. The distinct variants are then
compiled from a thread pool. With a warm cache the pass still dry-runs and loads them (measured 1.0-2.6 s on
an H200 host, paid back by a faster graph capture: 5.0 -> 1.9 s). MULTILORA_PRECOMPILE=0 turns it off.
"""

from __future__ import annotations

import os
import time
from itertools import accumulate

import torch

from multilora_cli.kernels.blocks import token_bucket
from multilora_cli.kernels.launch import collect, compile_all
from multilora_cli.kernels.penalties import ProcessPlan
from multilora_cli.kernels.sample import sample_rows
from multilora_cli.layers.context import StepContext, reset_context, set_context

EXACT_MAX = 256  # the kernel tables key on the exact token count up to here (one decode graph per size)


def prefill_sizes(max_tokens: int) -> list[int]:
    """Token counts of the dry prefill steps: EXACT_MAX (a chunk or mixed step), then each power-of-two bucket
    above it up to the bucket of `max_tokens`."""
    sizes = [min(EXACT_MAX, max_tokens)]
    b = EXACT_MAX * 2
    while b <= token_bucket(max_tokens):
        sizes.append(b)
        b *= 2
    return sizes


def _prefill_inputs(t: int, seq_len: int, prefix: int, block_size: int, device: torch.device, lora):
    """ids, positions and a prefill StepContext for t new tokens in sequences of seq_len (the last shorter),
    each after `prefix` cached tokens. Nothing is stored or read: the Triton kernels do not run."""
    qs = [seq_len] * (t // seq_len) + ([t % seq_len] if t % seq_len else [])
    ks = [q + prefix for q in qs]

    def cu(v):  # [B+1] int32 cumulative lengths
        return torch.tensor([0, *accumulate(v)], dtype=torch.int32, device=device)

    pos = torch.cat([torch.arange(prefix, prefix + q) for q in qs]).to(device)
    tables = None
    if prefix:
        tables = torch.zeros(len(qs), -(-max(ks) // block_size), dtype=torch.int32, device=device)
    ctx = StepContext(
        is_prefill=True,
        slot_mapping=torch.full((t,), -1, dtype=torch.int64, device=device),
        seqlens_q=qs,
        seqlens_k=ks,
        cu_seqlens_q=cu(qs),
        cu_seqlens_k=cu(ks),
        max_seqlen_q=max(qs),
        max_seqlen_k=max(ks),
        block_tables=tables,
        lora=lora,
    )
    return torch.zeros(t, dtype=torch.int64, device=device), pos, ctx


def _dry_sample(logits: torch.Tensor) -> None:
    """The sampling launches recorded on logits shaped as the runner's ([N, V], model dtype, contiguous): the
    full path with every pass (top-k and top-p variants), the top-k path (k 50: the usual candidate buffer), and
    both again with processing fused (a one-row plan with a token history: fp32 keys)."""
    dev, v = logits.device, logits.shape[1]
    one = torch.zeros(1, device=dev)
    ids = one.long()
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=dev)
    plan = ProcessPlan(
        rows=ids,
        hist=ids,
        rep=one + 1,
        freq=one,
        pres=one,
        ban_on=ids,
        bias_tok=torch.zeros(1, 8, dtype=torch.int64, device=dev),
        bias_val=torch.zeros(1, 8, device=dev),
        bias_len=ids,
        ban_tok=torch.zeros(1, 8, dtype=torch.int64, device=dev),
        ban_len=ids,
        num_history=1,
        counts=torch.zeros(1, v, dtype=torch.int32, device=dev),
    )
    for p in (None, plan):
        for k in (v, 50):  # v: the full path, every pass recorded; 50: the top-k path
            sample_rows(
                logits, ids, one + 1, ids + k, one + 1, one.double(), out,
                plan=p, any_top_k=True, any_top_p=True, max_top_k=k,
            )  # fmt: skip


@torch.inference_mode()
def precompile(
    model,
    graphs,
    meta_buffers,
    *,
    max_num_batched_tokens: int,
    max_model_len: int,
    block_size: int,
    device: torch.device,
) -> tuple[int, float]:
    """Dry-run the decode graphs' buckets (`graphs`: engine.cuda_graphs.DecodeGraphs or None) and the prefill
    sizes through `model`, LoRA metadata from `meta_buffers` (None without LoRA), then compile the recorded
    Triton kernels in parallel. Returns (distinct variants, seconds). CUDA only."""
    if device.type != "cuda" or os.environ.get("MULTILORA_PRECOMPILE", "").strip() == "0":
        return 0, 0.0
    t0 = time.perf_counter()
    seq_len = max(1, min(max_model_len - block_size, 512))
    with collect() as calls:
        if graphs is not None:
            graphs.dry_run()
        for i, t in enumerate(prefill_sizes(max_num_batched_tokens)):
            lora = meta_buffers.build([0] * t) if meta_buffers is not None else None
            # the first size also with a cached prefix: the paged variant of the prefill attention kernel
            for prefix in (0, block_size) if i == 0 else (0,):
                ids, pos, ctx = _prefill_inputs(t, min(seq_len, t), prefix, block_size, device, lora)
                set_context(ctx)
                try:
                    model(ids, pos)
                finally:
                    reset_context()
        if graphs is not None:
            graphs.lora_key = None  # the shared LoRA buffers were rewritten
        _dry_sample(
            model.compute_logits(
                torch.zeros(1, model.lm_head.weight.shape[1], device=device, dtype=model.lm_head.weight.dtype),
                upcast=False,
            )
        )
    torch.cuda.synchronize(device)
    return compile_all(calls), time.perf_counter() - t0
