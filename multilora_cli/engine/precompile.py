"""Compile the Triton kernels a run will launch before its first step, in parallel (kernels/launch.py).

A cold process (empty Triton cache: a fresh container, a new machine) compiled ~44 kernel variants one at a
time: in the warm-ups of the decode graphs and inside the first prefill steps of each size, ~15 s of a 35 s
one-shot run (benchmarks/RESULTS.md, "cold start"). Here the runner dry-runs the forwards it will run with
Triton launches recorded instead of run: every decode-graph bucket, and one prefill step per token bucket of
the kernel tables (`kernels.blocks.token_bucket`; below 256 tokens one per class of their blocks) up to
max_num_batched_tokens (a run's input may bound it: runner_sizing.precompile_tokens), without and with a cached
prefix, one sampling launch (kernels/sample.py) on the model's logits, and the logprob rows kernels
(kernels/logprobs.py) at k 0 (scoring) and 5. The distinct variants are then
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
from multilora_cli.kernels.logprobs import logprob_rows_triton
from multilora_cli.kernels.penalties import ProcessPlan
from multilora_cli.kernels.sample import sample_rows
from multilora_cli.layers.context import StepContext, reset_context, set_context

EXACT_MAX = 256  # the kernel tables key on the exact token count up to here (one decode graph per size)


CLASS_STEP = 16  # the kernel tables below EXACT_MAX change only at multiples of 16 tokens (kernels/blocks.py)


def prefill_sizes(max_tokens: int, skip: tuple[int, ...] | list[int] = ()) -> list[int]:
    """Token counts of the dry prefill steps. Up to EXACT_MAX the tables key on the exact count, but their
    blocks change only where the row tiles (16 rows) or a threshold (16, 64, 128 tokens) do, so one size per
    step of CLASS_STEP covers every count: 8 for 1-15 tokens, then 16, 32, ... below min(max_tokens, EXACT_MAX),
    and that count itself (its step's class); sizes in `skip` (decode buckets, dry-run by their graphs) are left
    out, but for that last one, the size of a chunk or mixed step, also dry-run with a cached prefix. Above
    EXACT_MAX each power-of-two bucket up to the bucket of `max_tokens`. A small job's eager steps (the demo's
    41 and 129 tokens) then find their kernels compiled instead of compiling them one by one mid-run."""
    top = min(EXACT_MAX, max_tokens)  # in the class of the multiple of CLASS_STEP above it
    small = [t for t in (8, *range(CLASS_STEP, EXACT_MAX + 1, CLASS_STEP)) if t < top] + [top]
    sizes = [t for t in small if t not in skip or t == top]  # the largest always: a chunk or mixed step's size
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


def _dry_logprobs(vocab: int, device: torch.device) -> None:
    """The logprob rows launches (kernels/logprobs.py) at k 0 (scoring, prompt logprobs 0) and 5: one variant of
    the tile kernel (k is not specialised on), the merge kernel's for k padded to 1 and to 8."""
    x = torch.zeros(1, vocab, device=device)  # [1, V] fp32 logits, as the runner's
    for k in (0, 5):
        logprob_rows_triton(x, torch.zeros(1, dtype=torch.long, device=device), k)


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
        sizes = prefill_sizes(max_num_batched_tokens, tuple(graphs.sizes) if graphs is not None else ())
        paged = min(EXACT_MAX, max_num_batched_tokens)
        for t in sizes:
            lora = meta_buffers.build([0] * t) if meta_buffers is not None else None
            # one size also with a cached prefix: the paged variant of the prefill attention kernel
            for prefix in (0, block_size) if t == paged else (0,):
                ids, pos, ctx = _prefill_inputs(t, min(seq_len, t), prefix, block_size, device, lora)
                set_context(ctx)
                try:
                    model(ids, pos)
                finally:
                    reset_context()
        if graphs is not None:
            graphs.lora_key = None  # the shared LoRA buffers were rewritten
        vocab = getattr(model.model, "vocab", None)
        if vocab is not None and vocab.head is not None:  # lm_head LoRA: its SGMV on the logits, per decode size
            w = model.lm_head.weight
            for n in graphs.sizes if graphs is not None else (1,):
                model.compute_logits(
                    torch.zeros(n, w.shape[1], device=device, dtype=w.dtype), upcast=False, slots=[0] * n
                )
        _dry_sample(
            model.compute_logits(
                torch.zeros(1, model.lm_head.weight.shape[1], device=device, dtype=model.lm_head.weight.dtype),
                upcast=False,
            )
        )
        _dry_logprobs(model.lm_head.weight.shape[0], device)
    torch.cuda.synchronize(device)
    return compile_all(calls), time.perf_counter() - t0
