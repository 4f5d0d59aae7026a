"""Test-side stand-ins for the runner: a block allocator and the HF references to compare against."""

from __future__ import annotations

import random

import torch

from multilora_cli.kernels import build_lora_meta
from multilora_cli.layers.context import decode_context, prefill_context, set_context


class Blocks:
    """Hands out KV blocks from a shuffled free list, so sequences own scattered, non-contiguous blocks."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0):
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}

    def ensure(self, seq: int, n_tokens: int) -> list[int]:
        table = self.tables.setdefault(seq, [])
        while len(table) * self.block_size < n_tokens:
            table.append(self.free.pop())
        return table


def run_prefill(
    model, blocks: Blocks, chunks: dict[int, tuple[list[int], int]], lora=None, prompt_lens: dict | None = None
) -> torch.Tensor:
    """chunks: {seq: (new token ids, number of tokens already cached)} -> logits [T, V] of every new token.
    LongRoPE models: a prompt longer than original_max_position_embeddings takes the long factors for all its
    tokens (transformers' prefill of that prompt); `prompt_lens` {seq: prompt length} when a chunk is not the
    whole prompt."""
    ids, pos, lq, lk, tables, long = [], [], [], [], [], []
    long_from = model.long_rope_from
    for seq, (toks, cached) in chunks.items():
        ids += toks
        pos += range(cached, cached + len(toks))
        lq.append(len(toks))
        lk.append(cached + len(toks))
        tables.append(blocks.ensure(seq, cached + len(toks)))
        if long_from is not None:
            n = (prompt_lens or {}).get(seq, cached + len(toks))
            long += [p >= long_from or n > long_from for p in range(cached, cached + len(toks))]
    dev = model.device
    ctx = prefill_context(lq, lk, tables, blocks.block_size, device=dev, lora=lora)
    if long_from is not None:
        ctx.rope_long = torch.tensor(long, device=dev)
    set_context(ctx)
    hidden = model(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev))
    return model.compute_logits(hidden).cpu()


def run_decode(model, blocks: Blocks, steps: dict[int, tuple[int, int]], lora=None) -> torch.Tensor:
    """steps: {seq: (new token id, its position)} -> logits [B, V]."""
    lens = [p + 1 for _, p in steps.values()]
    tables = [blocks.ensure(seq, p + 1) for seq, (_, p) in steps.items()]
    dev = model.device
    set_context(decode_context(lens, tables, blocks.block_size, device=dev, lora=lora))
    ids = torch.tensor([t for t, _ in steps.values()], device=dev)
    pos = torch.tensor([p for _, p in steps.values()], device=dev)
    return model.compute_logits(model(ids, pos)).cpu()


def hf_greedy(hf, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens after `prompt` by full forwards, and the logits [len(prompt)+n, V] of the whole sequence."""
    seq = list(prompt)
    for _ in range(n):
        logits = hf(torch.tensor([seq])).logits[0]
        seq.append(int(logits[-1].argmax()))
    return seq[len(prompt) :], hf(torch.tensor([seq])).logits[0].float()


def hf_generate(hf, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens after `prompt` by transformers' `generate` (KV cache: each decode step is a forward of one
    token, which is what LongRoPE's per-forward factor choice depends on), and logits [len(prompt) + n, V]: the
    prompt's forward, then each decode step's."""
    hf.generation_config.eos_token_id = None  # never stop early
    out = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=n + 1,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    steps = torch.cat([s.float() for s in out.logits[1:]])  # [n, V]: the logits after each generated token
    return out.sequences[0, len(prompt) : len(prompt) + n].tolist(), torch.cat(
        [hf(torch.tensor([prompt])).logits[0], steps]
    )


def prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def check_generation(
    ours,
    hf,
    vocab: int,
    lengths: list[int],
    block_size: int,
    *,
    steps: int = 4,
    atol: float = 1e-4,
    check_argmax: bool = True,
    cached: bool = False,
) -> None:
    """Packed prefill of len(lengths) sequences, then `steps` batched decodes fed HF's greedy tokens;
    every logit row is compared with HF's full-sequence forward (`cached`: with `generate`'s, step by step)."""
    seqs = prompts(lengths, vocab)
    refs = [(hf_generate if cached else hf_greedy)(hf, p, steps) for p in seqs]
    blocks = Blocks(64, block_size)
    ours.allocate_kv_cache(64, block_size)

    logits = run_prefill(ours, blocks, {i: (p, 0) for i, p in enumerate(seqs)})
    start = 0
    for p, (_, ref) in zip(seqs, refs):
        torch.testing.assert_close(logits[start : start + len(p)], ref[: len(p)], atol=atol, rtol=0)
        start += len(p)

    long_from = ours.long_rope_from
    for step in range(steps):
        feed = {i: (gen[step], len(p) + step) for i, (p, (gen, _)) in enumerate(zip(seqs, refs))}
        for i, (p, (gen, _)) in enumerate(zip(seqs, refs)):
            if long_from is not None and len(p) + step == long_from and len(p) <= long_from:
                # LongRoPE: the sequence passes long_from: its KV so far is recomputed with the long factors
                # (transformers' Phi-3 `generate` drops its cache here; engine/long_rope.py)
                run_prefill(ours, blocks, {i: ((p + gen)[:long_from], 0)}, prompt_lens={i: long_from + 1})
        logits = run_decode(ours, blocks, feed)
        for i, (p, (gen, ref)) in enumerate(zip(seqs, refs)):
            torch.testing.assert_close(logits[i], ref[len(p) + step], atol=atol, rtol=0)
            if check_argmax and step + 1 < steps:
                assert int(logits[i].argmax()) == gen[step + 1]


def check_chunked_prefill(ours, hf, vocab: int, *, atol: float = 1e-4) -> None:
    """Second halves attend to first halves read back from the cache; a fresh sequence rides along."""
    a, b, c = prompts([10, 17, 6], vocab, seed=3)
    ref = {k: hf(torch.tensor([p])).logits[0].float() for k, p in (("a", a), ("b", b), ("c", c))}
    blocks = Blocks(64, 4, seed=1)
    ours.allocate_kv_cache(64, 4)

    lens = {0: len(a), 1: len(b), 2: len(c)}  # LongRoPE: a chunk of a long prompt is rotated as the whole prompt
    first = run_prefill(ours, blocks, {0: (a[:5], 0), 1: (b[:9], 0)}, prompt_lens=lens)
    torch.testing.assert_close(first[:5], ref["a"][:5], atol=atol, rtol=0)
    torch.testing.assert_close(first[5:], ref["b"][:9], atol=atol, rtol=0)
    second = run_prefill(ours, blocks, {0: (a[5:], 5), 2: (c, 0), 1: (b[9:], 9)}, prompt_lens=lens)
    torch.testing.assert_close(second[:5], ref["a"][5:], atol=atol, rtol=0)
    torch.testing.assert_close(second[5:11], ref["c"], atol=atol, rtol=0)
    torch.testing.assert_close(second[11:], ref["b"][9:], atol=atol, rtol=0)


def check_mixed_lora_batch(model, batch_names: list, refs: list, slot_of, *, atol: float, steps: int) -> None:
    """One packed prefill of every row (each with its adapter slot, `slot_of(name)`, -1 = base), then `steps`
    batched decodes fed HF's greedy tokens; every logit row equals its reference. refs: per row (prompt ids,
    HF's greedy tokens, HF's logits [len(prompt) + steps, V]), in `batch_names` order."""
    blocks = Blocks(64, 4)
    model.allocate_kv_cache(64, 4)
    token_slots = [slot_of(n) for n, (p, _, _) in zip(batch_names, refs) for _ in p]
    logits = run_prefill(
        model, blocks, {i: (p, 0) for i, (p, _, _) in enumerate(refs)}, lora=build_lora_meta(token_slots)
    )
    start = 0
    for name, (p, _, ref) in zip(batch_names, refs):
        torch.testing.assert_close(
            logits[start : start + len(p)], ref[: len(p)], atol=atol, rtol=0, msg=lambda m: f"prefill {name}: {m}"
        )
        start += len(p)
    meta = build_lora_meta([slot_of(n) for n in batch_names])
    for step in range(steps):
        feed = {i: (gen[step], len(p) + step) for i, (p, gen, _) in enumerate(refs)}
        out = run_decode(model, blocks, feed, lora=meta)
        for i, (name, (p, _, ref)) in enumerate(zip(batch_names, refs)):
            torch.testing.assert_close(
                out[i], ref[len(p) + step], atol=atol, rtol=0, msg=lambda m: f"decode {step} {name}: {m}"
            )
