"""A step's logits beyond the sampler: which steps may skip it (every row greedy on its raw logits), and the
logprob rows of the step's sampled tokens and of its prompt positions, from fp32 logits (engine/logprobs.py):
the sampled rows' from the sampler's own fp32-output LM-head GEMM where the runner's check allows one GEMM
(`sampled_logprobs_of`, models/head_check.py), else from a second GEMM over the rows that ask
(`add_sampled_logprobs`).

    hidden: [N, H] model dtype (the rows that sample, or every prompt row of the step); row slots: [N] int, each
    row's adapter slot for lm_head adapters (layers/vocab_lora.py), None where the head is the base's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from multilora_cli.engine.logprobs import PromptRows, StepLogprobs, logprob_rows, prompt_logprobs

# hidden rows [n, H], their slots ([n] or None) -> fp32 logits [n, V] (Model.compute_logits_fp32)
LmHead = Callable[[torch.Tensor, np.ndarray | None], torch.Tensor]


def all_greedy(seqs) -> bool:
    """Every row is argmax of its raw logits (no row's logits are processed: see engine/sampler.py)."""
    return all((s.sampling.greedy or s.sampling.top_k == 1) and not s.sampling.processes_logits for s in seqs)


def add_sampled_logprobs(
    lp: StepLogprobs,
    plan: tuple,
    lm_head: LmHead,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    row_slots: np.ndarray | None,
    vocab: int,
    device: torch.device,
) -> None:
    """lp.sampled: the raw logprobs of the chosen tokens `ids` [N], rows that ask only (plan: engine/logprobs.
    sampled_plan of the step's sampled rows). From fp32 logits of the rows that ask (the sampler's model-dtype
    logits are rounded too coarsely for a log-likelihood), in chunks of rows."""
    rows, owners, ks = plan
    if len(rows) == ids.shape[0]:  # every row asks (one id per sampled row): no gather
        h, chosen, hs = hidden, ids, row_slots
    else:
        at = torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True)
        h, chosen = hidden.index_select(0, at), ids[at]
        hs = row_slots[rows] if row_slots is not None else None
    lp.sampled = logprob_rows(
        lambda lo, hi: lm_head(h[lo:hi], None if hs is None else hs[lo:hi]),
        h.shape[0],
        vocab,
        chosen,
        max(ks),
    )
    lp.sampled_owners, lp.sampled_ks = owners, ks
    lp.sampled_rows = None if len(rows) == ids.shape[0] else rows


def sampled_logprobs_of(lp: StepLogprobs, plan: tuple, asking: torch.Tensor, ids: torch.Tensor, device) -> None:
    """lp.sampled as `add_sampled_logprobs` makes it, from the asking rows' fp32 logits `asking` [R, V] that the
    sampler's own LM-head GEMM gave (Model.compute_logits_pair; R * V fits one chunk)."""
    rows, owners, ks = plan
    chosen = (
        ids if len(rows) == ids.shape[0] else ids[torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True)]
    )
    lp.sampled = logprob_rows(lambda lo, hi: asking[lo:hi], len(rows), asking.shape[1], chosen, max(ks))
    lp.sampled_owners, lp.sampled_ks = owners, ks
    lp.sampled_rows = None if len(rows) == ids.shape[0] else rows


def step_prompt_logprobs(
    lm_head: LmHead, hidden: torch.Tensor, prows: PromptRows, per_row_head: bool, vocab: int, device: torch.device
) -> torch.Tensor:
    """hidden: [T, H] of the step -> [R, 2 + 2k] for its prompt rows (engine/logprobs.py). `per_row_head`: the
    run has lm_head adapters, so each prompt row goes through its own adapter's head."""
    n = len(prows.rows)
    both = torch.tensor(prows.rows + prows.targets, dtype=torch.long).to(device, non_blocking=True)
    if not per_row_head:
        return prompt_logprobs(lm_head, hidden, both[:n], both[n:], max(prows.ks), vocab)
    slots = np.asarray([s.slot for s in prows.owners])  # each prompt row's adapter: lm_head adapters
    rows = both[:n]
    return logprob_rows(lambda lo, hi: lm_head(hidden[rows[lo:hi]], slots[lo:hi]), n, vocab, both[n:], max(prows.ks))
