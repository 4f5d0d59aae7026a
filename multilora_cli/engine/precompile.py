"""Compile the Triton kernels a run will launch before its first step, in parallel (kernels/launch.py).

A cold process (empty Triton cache: a fresh container, a new machine) compiled ~44 kernel variants one at a
time: in the warm-ups of the decode graphs and inside the first prefill steps of each size, ~15 s of a 35 s
one-shot run (benchmarks/RESULTS.md, "cold start"). Here the runner dry-runs the forwards it will run with
Triton launches recorded instead of run: every decode-graph bucket, and one prefill step per token bucket of
the kernel tables (`kernels.blocks.token_bucket`; below 256 tokens one per class of their blocks) up to
max_num_batched_tokens (a run's input may bound it: runner_sizing.precompile_tokens), without and with a cached
prefix, one step of base lines alone when some line runs the base (no LoRA kernel, the MLP's own activation
kernel), one slot load (kernels/scatter.py), and on the model's logits the sampling, logits processing, logprob
and grammar-mask launches the input's lines can make (engine/dry_sample.py: by their config.LineKinds). The
distinct variants are then compiled from a thread pool. With a warm cache the pass still dry-runs and loads them (measured 1.0-2.6 s on
an H200 host, paid back by a faster graph capture: 5.0 -> 1.9 s). MULTILORA_PRECOMPILE=0 turns it off.
"""

from __future__ import annotations

import os
import time
from itertools import accumulate

import torch

from multilora_cli.config import LineKind
from multilora_cli.engine.dry_sample import dry_sample
from multilora_cli.kernels.blocks import token_bucket
from multilora_cli.kernels.launch import collect, compile_all
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
    line_kinds: frozenset[LineKind] | None = None,
    slot_writer=None,
) -> tuple[int, float]:
    """Dry-run the decode graphs' buckets (`graphs`: engine.cuda_graphs.DecodeGraphs or None) and the prefill
    sizes through `model`, LoRA metadata from `meta_buffers` (None without LoRA), the launches after the forward
    that lines of `line_kinds` can make (engine/dry_sample.py; None: unknown), and a slot load (`slot_writer`:
    engine/slot_writer.SlotWriter or None), then compile the recorded Triton kernels in parallel. Returns
    (distinct variants, seconds). CUDA only."""
    if device.type != "cuda" or os.environ.get("MULTILORA_PRECOMPILE", "").strip() == "0":
        return 0, 0.0
    t0 = time.perf_counter()
    with collect() as calls:
        sizes = _dry_forwards(model, graphs, meta_buffers, max_num_batched_tokens, max_model_len, block_size, device)
        if meta_buffers is not None and (line_kinds is None or any(k.base for k in line_kinds)):
            # a step of base lines alone runs no LoRA kernel: the MLP's own SiLU-and-mul (kernels/norm_rope.py)
            # instead of the fused LoRA one; one size is enough (its variant does not depend on the tokens), a
            # dry-run one (its other kernels' variants are the adapted pass's)
            _dry_prefill(model, sizes[0], 0, max_model_len, block_size, device, None)
        if slot_writer is not None:
            slot_writer.dry_run()
        w = model.lm_head.weight
        dry_sample(
            model.compute_logits(torch.zeros(1, w.shape[1], device=device, dtype=w.dtype), upcast=False), line_kinds
        )
    torch.cuda.synchronize(device)
    return compile_all(calls), time.perf_counter() - t0


def _dry_prefill(model, t: int, prefix: int, max_model_len: int, block_size: int, device, lora) -> None:
    seq_len = max(1, min(max_model_len - block_size, 512))
    ids, pos, ctx = _prefill_inputs(t, min(seq_len, t), prefix, block_size, device, lora)
    set_context(ctx)
    try:
        model(ids, pos)
    finally:
        reset_context()


def _dry_forwards(model, graphs, meta_buffers, max_num_batched_tokens, max_model_len, block_size, device) -> list[int]:
    """Every decode graph's forward, the prefill sizes (one also after a cached prefix: the paged variant of the
    prefill attention), and lm_head LoRA's SGMV on the logits per decode size. Returns the prefill sizes."""
    if graphs is not None:
        graphs.dry_run()
    sizes = prefill_sizes(max_num_batched_tokens, tuple(graphs.sizes) if graphs is not None else ())
    paged = min(EXACT_MAX, max_num_batched_tokens)
    for t in sizes:
        lora = meta_buffers.build([0] * t) if meta_buffers is not None else None
        for prefix in (0, block_size) if t == paged else (0,):
            _dry_prefill(model, t, prefix, max_model_len, block_size, device, lora)
    if graphs is not None:
        graphs.lora_key = None  # the shared LoRA buffers were rewritten
    vocab = getattr(model.model, "vocab", None)
    if vocab is not None and vocab.head is not None:  # lm_head LoRA: its SGMV on the logits, per decode size
        w = model.lm_head.weight
        for n in graphs.sizes if graphs is not None else (1,):
            model.compute_logits(torch.zeros(n, w.shape[1], device=device, dtype=w.dtype), upcast=False, slots=[0] * n)
    return sizes
