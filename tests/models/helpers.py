"""Test-side stand-ins for the runner: a block allocator and the HF references to compare against."""

from __future__ import annotations

import random

import torch

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


def run_prefill(model, blocks: Blocks, chunks: dict[int, tuple[list[int], int]], lora=None) -> torch.Tensor:
    """chunks: {seq: (new token ids, number of tokens already cached)} -> logits [T, V] of every new token."""
    ids, pos, lq, lk, tables = [], [], [], [], []
    for seq, (toks, cached) in chunks.items():
        ids += toks
        pos += range(cached, cached + len(toks))
        lq.append(len(toks))
        lk.append(cached + len(toks))
        tables.append(blocks.ensure(seq, cached + len(toks)))
    dev = model.device
    set_context(prefill_context(lq, lk, tables, blocks.block_size, device=dev, lora=lora))
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
) -> None:
    """Packed prefill of len(lengths) sequences, then `steps` batched decodes fed HF's greedy tokens;
    every logit row is compared with HF's full-sequence forward."""
    seqs = prompts(lengths, vocab)
    refs = [hf_greedy(hf, p, steps) for p in seqs]
    blocks = Blocks(64, block_size)
    ours.allocate_kv_cache(64, block_size)

    logits = run_prefill(ours, blocks, {i: (p, 0) for i, p in enumerate(seqs)})
    start = 0
    for p, (_, ref) in zip(seqs, refs):
        torch.testing.assert_close(logits[start : start + len(p)], ref[: len(p)], atol=atol, rtol=0)
        start += len(p)

    for step in range(steps):
        feed = {i: (gen[step], len(p) + step) for i, (p, (gen, _)) in enumerate(zip(seqs, refs))}
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

    first = run_prefill(ours, blocks, {0: (a[:5], 0), 1: (b[:9], 0)})
    torch.testing.assert_close(first[:5], ref["a"][:5], atol=atol, rtol=0)
    torch.testing.assert_close(first[5:], ref["b"][:9], atol=atol, rtol=0)
    second = run_prefill(ours, blocks, {0: (a[5:], 5), 2: (c, 0), 1: (b[9:], 9)})
    torch.testing.assert_close(second[:5], ref["a"][5:], atol=atol, rtol=0)
    torch.testing.assert_close(second[5:11], ref["c"], atol=atol, rtol=0)
    torch.testing.assert_close(second[11:], ref["b"][9:], atol=atol, rtol=0)
