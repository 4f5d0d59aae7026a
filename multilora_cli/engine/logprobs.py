"""Logprobs of a step, on the device, for only the rows that ask: the model's own log-softmax in fp32.

Two kinds of rows (each row is one position of one sequence, scoring the token that follows it):
- sampled rows: a sequence with `sampling.logprobs` k gets, per generated token, the logprob of the token the
  sampler chose and the k most likely tokens, from the model's raw logits (before logits processing,
  temperature, top-k/top-p: vLLM's default "raw" logprobs), from an fp32 LM-head output for those rows (the
  sampler's model-dtype logits are too coarse for a log-likelihood; see below);
- prompt rows: a sequence whose prompt positions' logits are needed (`prompt_logprobs` k, or a scoring
  request's continuation) gets, per position p, the logprob of prompt token p + 1, the position's argmax and top
  k. Their hidden states go through the LM head here, in chunks of rows, so no [tokens, vocab] fp32 tensor of a
  whole step is ever made (only a chunk's: `CHUNK_ELEMS`).

Per row the device computes, in fp32: lp = x[target] - logsumexp(x), argmax(x), top-k of x minus logsumexp (ties:
lowest id first); packed into ONE fp32 tensor [R, 2 + 2k] = (lp, argmax, id_1, lp_1, ..., id_k, lp_k) (token ids
< 2^24 are exact in fp32; a row's own k <= k is the prefix of its row) that reaches the host with the step's
sampled ids. On CUDA one fused Triton kernel reads the logits once for all of it (kernels/logprobs.py; torch's
logsumexp, gather, argmax and topk made several passes and temporaries over [R, V]); elsewhere its torch
reference. On the host a step's sampled rows become TokenLogprob entries as soon as its ids are read back, while
the next step runs (`entries_of`: columns of the step's array, ~1.3 us a token at k 5), each appended to its
sequence; prompt rows stay numpy views (one append per row) until the result is built (`entries`, `unpack`).
A step whose rows ask for nothing builds and computes nothing.

The sampled rows' fp32 logits and the sampler's model-dtype logits come from ONE fp32-output LM-head GEMM over
the step's sampled rows, the sampler's rounded to the model dtype (Model.compute_logits_pair), where the runner's
start-time check found that rounding gives exactly the bits of the model-dtype GEMM at that row count
(models/head_check.py): the sampler's logits must be the same bits whether or not a row (or its neighbour) asks
for logprobs, or a greedy near-tie would make a row's text depend on its neighbours' requests. Elsewhere the
model-dtype GEMM runs for every row as without logprobs and the asking rows pay a second, fp32-output one
(~0.4 ms at 256 rows of a 128k vocabulary on an H200). The run's stats say which (`startup.logprob_lm_head`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.request import TokenLogprob
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.kernels import use_triton

CHUNK_ELEMS = 1 << 25  # fp32 logits of one chunk of rows: 128 MiB (256 rows of a 128k vocabulary)


def logprob_rows(
    chunk: Callable[[int, int], torch.Tensor],
    num_rows: int,
    vocab: int,
    targets: torch.Tensor,
    k: int,
    chunk_elems: int = CHUNK_ELEMS,
) -> torch.Tensor:
    """[R, 2 + 2k] fp32: per row (logprob of targets[r], argmax, then k (id, logprob) pairs, most likely first,
    ties lowest id first).

    chunk(lo, hi) -> the fp32 logits [hi - lo, V] of rows lo .. hi - 1, asked for at most chunk_elems // V rows
    at a time; targets: [R] long on their device. Each chunk goes through kernels/logprobs.py: the fused Triton
    kernel on CUDA (one read of the logits), its torch reference elsewhere."""
    # imported here, not at the top: its Triton kernel is JIT-parsed only by a run whose lines ask for logprobs
    from multilora_cli.kernels.logprobs import logprob_rows_torch, logprob_rows_triton

    step = max(1, chunk_elems // max(vocab, 1))
    parts = []
    for lo in range(0, num_rows, step):
        hi = min(num_rows, lo + step)
        x = chunk(lo, hi)  # [c, V] fp32
        rows = logprob_rows_triton if use_triton(x) else logprob_rows_torch
        parts.append(rows(x, targets[lo:hi], k))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def prompt_logprobs(
    lm_head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, rows: torch.Tensor, targets, k: int, vocab
) -> torch.Tensor:
    """hidden: [T, H] of a step; rows: [R] long token rows; lm_head: hidden [c, H] -> fp32 logits [c, V]."""
    return logprob_rows(lambda lo, hi: lm_head(hidden[rows[lo:hi]]), rows.shape[0], vocab, targets, k)


@dataclass(slots=True)
class PromptRows:
    """A step's prompt rows: flat token rows and next-token targets, the sequence and k of each row."""

    rows: list[int]
    targets: list[int]
    owners: list[Sequence]
    ks: list[int]

    @classmethod
    def of(cls, batch: ScheduledBatch) -> PromptRows | None:
        """None when no sequence of `batch` needs a prompt position's logits this step (the common case)."""
        out = None
        flat = 0
        for seq, s, n in zip(batch.seqs, batch.start, batch.num_new_tokens):
            if seq.prompt_lp is not None:
                positions = seq.prompt_logit_positions(s, n)
                if positions:
                    out = out or cls([], [], [], [])
                    k = seq.sampling.prompt_logprobs or 0  # (a scoring row: its logprob and argmax only)
                    for p in positions:
                        out.rows.append(flat + p - s)
                        out.targets.append(seq.token_ids[p + 1])
                        out.owners.append(seq)
                        out.ks.append(k)
            flat += n
        return out


@dataclass(slots=True)
class StepLogprobs:
    """What a step computed for its logprob rows: packed [R, 2 + 2k] tensors (sampled, prompt) and whom each row
    belongs to; `attach` hands each row to its sequence once the step's ids are on the host. sampled_rows: the
    sampled rows' places among the step's sampled sequences (None: every one, in order)."""

    sampled: torch.Tensor | None = None
    sampled_owners: list[Sequence] | None = None
    sampled_ks: list[int] | None = None
    sampled_rows: list[int] | None = None
    prompt: torch.Tensor | None = None
    prompt_rows: PromptRows | None = None

    def to_host(self) -> None:
        """Queue the copies to the host (call before the step's done event is recorded)."""
        if self.sampled is not None:
            self.sampled = self.sampled.to("cpu", non_blocking=True)
        if self.prompt is not None:
            self.prompt = self.prompt.to("cpu", non_blocking=True)

    def attach(self, ids: list[int], texts: Callable[[list[int]], list[str]]) -> None:
        """After the step's done event, with its sampled ids `ids` (one per sampled sequence) on the host: each
        sampled row becomes its TokenLogprob now (`entries_of`: while the next step runs on the device, rather
        than a whole sequence's at once when it finishes, when the device has nothing queued) appended to
        `seq.logprobs` (skipped for a sequence that stopped at the step before this `ahead` one: its token is
        dropped too); each prompt row (a numpy view, cut to the row's own k) is appended to `seq.prompt_lp`."""
        if self.sampled is not None:
            chosen = ids if self.sampled_rows is None else [ids[i] for i in self.sampled_rows]
            made = entries_of(chosen, self.sampled.numpy(), texts)
            ks, running = self.sampled_ks, SeqStatus.RUNNING
            if min(ks) != max(ks):  # rows of a smaller k: their own top only
                for e, k in zip(made, ks):
                    del e.top[k:]
            for seq, e in zip(self.sampled_owners, made):
                if seq.status is running:
                    seq.logprobs.append(e)
        if self.prompt is not None:
            pr, rows = self.prompt_rows, self.prompt.numpy()
            width = rows.shape[1]
            for seq, k, row in zip(pr.owners, pr.ks, rows):
                seq.prompt_lp.append(row if 2 + 2 * k == width else row[: 2 + 2 * k])


def unpack(rows: list) -> list[tuple[float, int, list[tuple[int, float]]]]:
    """A sequence's kept rows (numpy [2 + 2k] each, one k) -> (logprob, argmax id, [(id, logprob)] * k) each."""
    if not rows:
        return []
    arr = np.stack(rows)  # [T, 2 + 2k]
    ids = arr[:, 2::2].astype(np.int64).tolist()
    return list(
        zip(arr[:, 0].tolist(), arr[:, 1].astype(np.int64).tolist(), map(list, map(zip, ids, arr[:, 3::2].tolist())))
    )


def entries(token_ids: list[int], rows: list, texts: Callable[[list[int]], list[str]]) -> list[TokenLogprob]:
    """TokenLogprob per (token id, kept row) pair, up to the shorter of the two. rows: numpy [2 + 2k] each, one
    k (a sequence's prompt rows). texts: token ids -> their texts."""
    n = min(len(token_ids), len(rows))
    return entries_of(token_ids[:n], np.stack(rows[:n]), texts) if n else []


def entries_of(ids: list[int], arr: np.ndarray, texts: Callable[[list[int]], list[str]]) -> list[TokenLogprob]:
    """TokenLogprob per row of `arr` [n, 2 + 2k] (packed rows) with the token ids `ids` [n]. Columns come out of
    the array and the entries out of C-level zip / map (a few numpy calls and one Python-level slice per row, not
    per top token): ~1.3 us a token at k 5 against ~2 for a zip per token and ~3 for per-row unpacking."""
    n = arr.shape[0]
    if n == 0:
        return []
    k = (arr.shape[1] - 2) // 2
    top_ids = arr[:, 2::2].astype(np.int64).ravel().tolist()  # [n * k], row-major
    flat = list(zip(top_ids, texts(top_ids), arr[:, 3::2].ravel().tolist()))  # (id, text, logprob) [n * k]
    tops = [flat[i : i + k] for i in range(0, n * k, k)] if k else [[] for _ in range(n)]
    return list(map(TokenLogprob, ids, arr[:, 0].tolist(), tops, texts(ids)))


def sampled_plan(seqs: list[Sequence]) -> tuple[list[int], list[Sequence], list[int]] | None:
    """(rows among `seqs`, their sequences, their k) of the sampled sequences asking for logprobs; None if none."""
    owners = [s for s in seqs if s.logprobs is not None]
    if not owners:
        return None
    rows = (
        list(range(len(seqs)))
        if len(owners) == len(seqs)
        else [i for i, s in enumerate(seqs) if s.logprobs is not None]
    )
    return rows, owners, [s.request.sampling.logprobs for s in owners]
