"""`Sampler`: logits -> next token ids; greedy, temperature, top-k, top-p; batch-composition invariant.

Each sampled row draws ONE uniform number u = hash(seed, position) (SplitMix64, computed on the host; no
device RNG state) and picks the token by inverse CDF: the first token whose cumulative probability exceeds
u * total. The order the CDF walks is fixed per row by the row's own parameters:
- no top-k / top-p: vocabulary order, no sort (one cumsum + searchsorted pass over the row);
- with top-k / top-p: descending probability (stable sort, ties by token id), which is also where the
  top-k / top-p masks are computed (transformers' order: temperature, then top-k, then top-p on the
  renormalised top-k distribution).
So a row's token depends only on its logits, its SamplingParams, its seed and its position, never on the
other rows. One draw per row instead of per (row, token) keeps the cost at a couple of passes over the logits.
temperature 0 (greedy) is argmax. Runs on any device; the only host sync is the caller reading the ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.sequence import Sequence, splitmix64

_MASK64 = (1 << 64) - 1


def uniform(seed: int, position: int) -> float:
    """u in [0, 1) with 53 random bits, a pure function of (seed, position)."""
    x = splitmix64(splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return (x >> 11) * (1.0 / (1 << 53))


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling inputs, split by kind. Index lists are host-side; tensors live on the logits' device."""

    greedy_rows: torch.Tensor  # [G] long
    plain_rows: torch.Tensor  # [P] long: temperature > 0, no top-k / top-p
    plain_temp: torch.Tensor  # [P] float32
    plain_u: torch.Tensor  # [P] float64
    filtered_rows: torch.Tensor  # [F] long: temperature > 0 with top-k and/or top-p
    filtered_temp: torch.Tensor  # [F] float32
    filtered_top_k: torch.Tensor  # [F] long (vocab size when off)
    filtered_top_p: torch.Tensor  # [F] float32
    filtered_u: torch.Tensor  # [F] float64
    num_rows: int

    @classmethod
    def build(cls, params: list[SamplingParams], seeds: list[int], positions: list[int], vocab_size: int,
              device: torch.device | str = "cpu") -> "SamplingBatch":
        """Group rows by kind and move their parameters to `device` (one small copy per field)."""
        g, p, f = [], [], []
        for i, sp in enumerate(params):
            if sp.greedy or sp.top_k == 1:
                g.append(i)
            elif sp.top_k == 0 and sp.top_p >= 1.0:
                p.append(i)
            else:
                f.append(i)
        dev = torch.device(device)

        def t(values, dtype):
            return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

        return cls(
            greedy_rows=t(g, torch.long),
            plain_rows=t(p, torch.long),
            plain_temp=t([params[i].temperature for i in p], torch.float32),
            plain_u=t([uniform(seeds[i], positions[i]) for i in p], torch.float64),
            filtered_rows=t(f, torch.long),
            filtered_temp=t([params[i].temperature for i in f], torch.float32),
            filtered_top_k=t([min(params[i].top_k, vocab_size) or vocab_size for i in f], torch.long),
            filtered_top_p=t([params[i].top_p for i in f], torch.float32),
            filtered_u=t([uniform(seeds[i], positions[i]) for i in f], torch.float64),
            num_rows=len(params),
        )

    @classmethod
    def for_seqs(cls, seqs: list[Sequence], vocab_size: int, device: torch.device | str = "cpu",
                 ahead: bool = False) -> "SamplingBatch":
        """Rows = `seqs` (e.g. `ScheduledBatch.sampled_seqs()`), each at its `sample_position`; `ahead`: one
        position further (a step launched before the previous step's token reached the host:
        `ScheduledBatch.ahead`)."""
        step = 1 if ahead else 0
        return cls.build([s.sampling for s in seqs], [s.seed for s in seqs],
                         [s.sample_position + step for s in seqs], vocab_size, device)


def _pick(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: index of the first entry whose cumulative sum exceeds u * total. probs: [R, V] >= 0."""
    cum = probs.cumsum(dim=-1)  # [R, V]
    total = cum[:, -1:]
    target = (u.unsqueeze(1) * total.double()).to(cum.dtype)
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))  # strictly below total
    idx = torch.searchsorted(cum, target, right=True)  # [R, 1]
    return idx.clamp_(max=probs.shape[-1] - 1).squeeze(1)


def filtered_sorted_probs(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor,
                          top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k then top-p over logits / temp, in descending order. Returns (probs [R, V] unnormalised-after-mask
    with removed entries 0, token ids [R, V]). logits: [R, V] float32."""
    scaled = logits.float() / temp.unsqueeze(1)
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    ranks = torch.arange(scaled.shape[-1], device=scaled.device)
    sorted_logits = sorted_logits.masked_fill(ranks.unsqueeze(0) >= top_k.unsqueeze(1), float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # top-p: drop a token when the tokens ranked above it already hold top_p of the mass (the first one never)
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(mass_before >= top_p.unsqueeze(1), 0.0)
    return probs, order


class Sampler:
    """Stateless: `sampler(logits, batch) -> LongTensor [B]` of next token ids (on the logits' device)."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        # logits: [B, V] (any float dtype; computed in float32)
        if logits.shape[0] != batch.num_rows:
            raise ValueError(f"logits have {logits.shape[0]} rows, sampling batch has {batch.num_rows}")
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        if batch.greedy_rows.numel():
            out[batch.greedy_rows] = logits[batch.greedy_rows].argmax(dim=-1)
        if batch.plain_rows.numel():
            rows = logits[batch.plain_rows].float() / batch.plain_temp.unsqueeze(1)
            probs = torch.softmax(rows, dim=-1)
            out[batch.plain_rows] = _pick(probs, batch.plain_u)
        if batch.filtered_rows.numel():
            probs, order = filtered_sorted_probs(logits[batch.filtered_rows], batch.filtered_temp,
                                                 batch.filtered_top_k, batch.filtered_top_p)
            pos = _pick(probs, batch.filtered_u)
            out[batch.filtered_rows] = order.gather(1, pos.unsqueeze(1)).squeeze(1)
        return out
