"""`Sampler`: logits -> next token ids; greedy, temperature, top-k, top-p; batch-composition invariant.

Each sampled row draws ONE uniform number u = hash(seed, position) (SplitMix64, computed on the host; no
device RNG state) and picks the token by inverse CDF over its kept tokens in vocabulary order: the first token
whose running sum of weights exceeds u * total. Which tokens are kept is defined by the logits' order, not by a
sorted copy (kernels/sample.py): top-k keeps the keys >= the k-th largest (ties kept, as transformers'
warper does), top-p then keeps each token whose strictly larger kept mass is < top_p of the kept total
(transformers' order: temperature, then top-k, then top-p on the renormalised top-k distribution). On CUDA a
Triton kernel finds both thresholds by radix search over chunks of each row, with no sort; elsewhere the same
definition runs as torch ops. So a row's token depends only on its logits, its SamplingParams, its seed and
its position, never on the other rows. temperature 0 (greedy) and top_k 1 are argmax. The only host sync is
the caller reading the ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.sequence import Sequence, splitmix64
from multilora_cli.kernels import use_triton
from multilora_cli.kernels.sample import sample_rows, sample_rows_torch

_MASK64 = (1 << 64) - 1


def uniform(seed: int, position: int) -> float:
    """u in [0, 1) with 53 random bits, a pure function of (seed, position)."""
    x = splitmix64(splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return (x >> 11) * (1.0 / (1 << 53))


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling inputs: greedy rows, and the sampled rows with their parameters (on the logits' device)."""

    greedy_rows: torch.Tensor  # [G] long: temperature 0 or top_k 1
    rows: torch.Tensor  # [S] long: temperature > 0
    temp: torch.Tensor  # [S] float32
    top_k: torch.Tensor  # [S] long (vocab size when off)
    top_p: torch.Tensor  # [S] float32 (1 when off)
    u: torch.Tensor  # [S] float64
    num_rows: int
    any_top_k: bool = True  # some sampled row filters by top-k / top-p: the kernel's passes for it run
    any_top_p: bool = True

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        seeds: list[int],
        positions: list[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """Split rows by kind; every field goes to `device` in ONE float64 copy (exact for these values: ids and
        top-k are integers < 2^53, temperature and top-p round to float32 as from the Python float)."""
        g, s = [], []
        for i, sp in enumerate(params):
            (g if sp.greedy or sp.top_k == 1 else s).append(i)
        k = [min(params[i].top_k, vocab_size) or vocab_size for i in s]
        host = torch.tensor(
            g
            + s
            + [params[i].temperature for i in s]
            + k
            + [params[i].top_p for i in s]
            + [uniform(seeds[i], positions[i]) for i in s],
            dtype=torch.float64,
        )
        dev = host.to(torch.device(device), non_blocking=True)
        n = len(s)
        rows, temp, top_k, top_p, u = (dev[len(g) + j * n : len(g) + (j + 1) * n] for j in range(5))
        return cls(
            greedy_rows=dev[: len(g)].long(),
            rows=rows.long(),
            temp=temp.float(),
            top_k=top_k.long(),
            top_p=top_p.float(),
            u=u,
            num_rows=len(params),
            any_top_k=any(x < vocab_size for x in k),
            any_top_p=any(params[i].top_p < 1.0 for i in s),
        )

    @classmethod
    def for_seqs(
        cls, seqs: list[Sequence], vocab_size: int, device: torch.device | str = "cpu", ahead: bool = False
    ) -> SamplingBatch:
        """Rows = `seqs` (e.g. `ScheduledBatch.sampled_seqs()`), each at its `sample_position`; `ahead`: one
        position further (a step launched before the previous step's token reached the host:
        `ScheduledBatch.ahead`)."""
        step = 1 if ahead else 0
        return cls.build(
            [s.sampling for s in seqs],
            [s.seed for s in seqs],
            [s.sample_position + step for s in seqs],
            vocab_size,
            device,
        )


class Sampler:
    """Stateless: `sampler(logits, batch) -> LongTensor [B]` of next token ids (on the logits' device)."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        # logits: [B, V] (any float dtype: the model's is read as it is; weights are computed in float32)
        if logits.shape[0] != batch.num_rows:
            raise ValueError(f"logits have {logits.shape[0]} rows, sampling batch has {batch.num_rows}")
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        if batch.greedy_rows.numel():
            out[batch.greedy_rows] = logits[batch.greedy_rows].argmax(dim=-1)
        if batch.rows.numel():
            if use_triton(logits):
                sample_rows(
                    logits,
                    batch.rows,
                    batch.temp,
                    batch.top_k,
                    batch.top_p,
                    batch.u,
                    out,
                    any_top_k=batch.any_top_k,
                    any_top_p=batch.any_top_p,
                )
            else:
                out[batch.rows] = sample_rows_torch(logits[batch.rows], batch.temp, batch.top_k, batch.top_p, batch.u)
        return out
