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
    set_context(prefill_context(lq, lk, tables, blocks.block_size, lora=lora))
    hidden = model(torch.tensor(ids), torch.tensor(pos))
    return model.compute_logits(hidden)


def run_decode(model, blocks: Blocks, steps: dict[int, tuple[int, int]], lora=None) -> torch.Tensor:
    """steps: {seq: (new token id, its position)} -> logits [B, V]."""
    lens = [p + 1 for _, p in steps.values()]
    tables = [blocks.ensure(seq, p + 1) for seq, (_, p) in steps.items()]
    set_context(decode_context(lens, tables, blocks.block_size, lora=lora))
    ids = torch.tensor([t for t, _ in steps.values()])
    pos = torch.tensor([p for _, p in steps.values()])
    return model.compute_logits(model(ids, pos))


def hf_greedy(hf, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens after `prompt` by full forwards, and the logits [len(prompt)+n, V] of the whole sequence."""
    seq = list(prompt)
    for _ in range(n):
        logits = hf(torch.tensor([seq])).logits[0]
        seq.append(int(logits[-1].argmax()))
    return seq[len(prompt):], hf(torch.tensor([seq])).logits[0].float()


def prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
