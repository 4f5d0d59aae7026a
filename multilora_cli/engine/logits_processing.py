"""Logits processing per row, on the device: logit_bias, the penalties, min_tokens (kernels/penalties.py says the
arithmetic and its order), and the device-side token history the penalties read.

Why the history lives on the device: with run-ahead (EngineConfig.run_ahead) step t+1 is launched before step t's
ids reach the host, so a penalty computed from host-side token lists would miss the token sampled at step t.
`TokenHistory` keeps a [max_num_seqs, V] int32 count buffer, allocated the first time a sequence with a penalty
is sampled (rows without one never touch it). A sequence that processes its logits owns one row from its first
sampled step until it stops
running (its row is taken back when a row is needed and it no longer runs); the row is written at that step from
its host tokens (its prompt marked with SEEN_IN_PROMPT for repetition_penalty, its generated tokens counted), and
again at its first sampled step after each preemption (the recompute: all its tokens are on the host then, as
no step runs ahead across a preemption), and every step adds the token it sampled, on the device, in stream order
after the step's draw and before the next step's processing. So step t+1 sees step t's token though the host has
not read it yet, and a row given to another sequence is rewritten after the last update of its previous owner
(steps run in order on the device).
The same table row holds the sequence's logit_bias (sorted) and stop set, written once when the sequence gets its
row: a step sends only [P]-sized fields (the rows, penalties, whether min_tokens still bans), not the entries,
so nothing per entry is built on the host on the step path (256 rows x 10 biases: a ~1k-number list a step).
A row's draw still depends only on (seed, position): processing changes its logits, never its u.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.errors import EngineError
from multilora_cli.kernels import use_triton
from multilora_cli.kernels.penalties import SEEN_IN_PROMPT, ProcessPlan, process_rows, process_rows_torch


class TokenHistory:
    """The sequence table: per running sequence that processes its logits, its row of token counts, logit_bias
    and stop set on the device (see the module docstring). Not thread-safe: the runner's step loop is its only
    user."""

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device | str):
        self.max_rows, self.vocab_size, self.device = max_rows, vocab_size, torch.device(device)
        self.counts: torch.Tensor | None = None  # [max_rows, V] int32, allocated when a penalty first needs it
        # [max_rows, W] sorted entries + [max_rows] lengths, allocated on first use, widened when a row needs it
        self.bias_tok: torch.Tensor | None = None  # int64
        self.bias_val: torch.Tensor | None = None  # fp32
        self.bias_len: torch.Tensor | None = None  # int64
        self.ban_tok: torch.Tensor | None = None  # int64: the stop set (what min_tokens bans)
        self.ban_len: torch.Tensor | None = None  # int64
        self._owner: dict[int, tuple[Sequence, int, int]] = {}  # seq_id -> (sequence, row, its preemptions then)
        self._free = list(range(max_rows - 1, -1, -1))

    @property
    def rows_in_use(self) -> int:
        return len(self._owner)

    def rows_for(self, seqs: list[Sequence], ahead: bool = False, eos_token_ids=()) -> list[int]:
        """Each sequence's row (-1 for those that process nothing). A sequence met for the first time gets its row
        written (logit_bias, stop set with `eos_token_ids`, and with a penalty its counts from its host tokens);
        with a penalty also at its first step since a preemption. `ahead` (the step after one still in flight):
        a sequence with a penalty must have its counts already."""
        out, new = [], []
        for seq in seqs:
            sp = seq.sampling
            if not sp.processes_logits:
                out.append(-1)
                continue
            held = self._owner.get(seq.seq_id)
            if held is None or (sp.needs_history and held[2] != seq.num_preemptions):
                if ahead and sp.needs_history:
                    raise EngineError(f"internal: {seq} runs ahead without its token history")
                row = held[1] if held is not None else self._take()
                held = self._owner[seq.seq_id] = (seq, row, seq.num_preemptions)
                new.append(held)
            out.append(held[1])
        if new:
            self._write(new, eos_token_ids)
        return out

    def _take(self) -> int:
        if not self._free:  # rows of sequences no longer running (finished, or preempted: rebuilt on return)
            for sid, (seq, row, _) in list(self._owner.items()):
                if seq.status is not SeqStatus.RUNNING:
                    del self._owner[sid]
                    self._free.append(row)
        if not self._free:
            raise EngineError(f"internal: more than {self.max_rows} running sequences need a token history")
        return self._free.pop()

    def _widen(self, name: str, width: int, dtype: torch.dtype) -> None:
        """Table `name` ([max_rows, W]) at least `width` wide, its entries kept."""
        old = getattr(self, name)
        if old is not None and old.shape[1] >= width:
            return
        w = max(8, 1 << max(0, width - 1).bit_length())  # powers of two: few widenings
        t = torch.zeros(self.max_rows, w, dtype=dtype, device=self.device)
        if old is not None:
            t[:, : old.shape[1]] = old
        setattr(self, name, t)

    def _write(self, new: list[tuple[Sequence, int, int]], eos_token_ids) -> None:
        """Rows of `new` := their logit_bias and stop set; with a penalty, their counts."""
        self.write_tables([(seq.sampling, row) for seq, row, _ in new], eos_token_ids)
        counted = [(seq, row) for seq, row, _ in new if seq.sampling.needs_history]
        if counted:
            self._write_counts(counted)

    def write_tables(self, entries: list[tuple[SamplingParams, int]], eos_token_ids) -> None:
        """For each (params, row): the row's logit_bias entries (sorted by token) and stop set (with
        `eos_token_ids` unless ignore_eos), in the tables at `row`."""
        if self.bias_len is None:
            self.bias_len = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
            self.ban_len = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        bias = [sorted(sp.logit_bias.items()) for sp, _ in entries]
        ban = [sorted(set(stop_set(sp, eos_token_ids))) for sp, _ in entries]
        self._widen("bias_tok", max(map(len, bias)), torch.int64)
        self._widen("bias_val", self.bias_tok.shape[1], torch.float32)
        self._widen("ban_tok", max(map(len, ban)), torch.int64)
        bw, nw, n = self.bias_tok.shape[1], self.ban_tok.shape[1], len(entries)
        # dense [n, W] host rows from flat lists (one tensor each, not one per row: 256 new sequences at once)
        br = [k for k, b in enumerate(bias) for _ in b]
        bc = [j for b in bias for j in range(len(b))]
        nr = [k for k, x in enumerate(ban) for _ in x]
        nc = [j for x in ban for j in range(len(x))]
        bt, bv = torch.zeros(n, bw, dtype=torch.int64), torch.zeros(n, bw)
        nt = torch.zeros(n, nw, dtype=torch.int64)
        bt[br, bc] = torch.tensor([t for b in bias for t, _ in b], dtype=torch.int64)
        bv[br, bc] = torch.tensor([v for b in bias for _, v in b], dtype=torch.float32)
        nt[nr, nc] = torch.tensor([t for x in ban for t in x], dtype=torch.int64)
        rows = torch.tensor([row for _, row in entries], dtype=torch.int64).to(self.device)
        lens = torch.tensor([[len(b), len(x)] for b, x in zip(bias, ban)], dtype=torch.int64).to(self.device)
        self.bias_tok[rows] = bt.to(self.device)
        self.bias_val[rows] = bv.to(self.device)
        self.ban_tok[rows] = nt.to(self.device)
        self.bias_len[rows] = lens[:, 0]
        self.ban_len[rows] = lens[:, 1]

    def _write_counts(self, new: list[tuple[Sequence, int]]) -> None:
        """Count rows of `new` := SEEN_IN_PROMPT at their prompt tokens + the counts of their generated tokens."""
        if self.counts is None:
            self.counts = torch.zeros(self.max_rows, self.vocab_size, dtype=torch.int32, device=self.device)
        rows, pr, pt, gr, gt = [], [], [], [], []
        for seq, row in new:
            rows.append(row)
            prompt = seq.prompt_token_ids
            pr += [row] * len(prompt)
            pt += prompt
            gen = seq.token_ids[len(prompt) :]
            gr += [row] * len(gen)
            gt += gen
        host = torch.tensor(rows + pr + pt + gr + gt, dtype=torch.int64)
        dev = host.to(self.device, non_blocking=True)
        rows_d, pr_d, pt_d, gr_d, gt_d = dev.split([len(rows), len(pr), len(pt), len(gr), len(gt)])
        c = self.counts
        c.index_fill_(0, rows_d, 0)
        c.index_put_((pr_d, pt_d), torch.tensor(SEEN_IN_PROMPT, dtype=torch.int32, device=self.device))
        if gt:
            c.index_put_((gr_d, gt_d), torch.ones(len(gt), dtype=torch.int32, device=self.device), accumulate=True)


def stop_set(sp: SamplingParams, eos_token_ids) -> list[int]:
    """The tokens that end `sp`'s completion: its stop_token_ids, and eos unless ignore_eos."""
    ids = list(sp.stop_token_ids)
    if not sp.ignore_eos:
        ids += [t for t in eos_token_ids if t not in ids]
    return ids


def bans_now(sp: SamplingParams, position: int, eos_token_ids) -> bool:
    """Whether min_tokens bans the stop set (its stop_token_ids, and eos unless ignore_eos; the table holds it) at
    completion position `position` (tokens generated before it): position < min_tokens and the set is not empty
    (transformers' MinNewTokensLengthLogitsProcessor, vLLM's min_tokens). No list is built: it runs per row per
    step."""
    return position < sp.min_tokens and bool(sp.stop_token_ids or (eos_token_ids and not sp.ignore_eos))


def needs_processing(sp: SamplingParams, bans: bool) -> bool:
    """Whether the row's logits change this step (else it is sampled from the raw logits, paying nothing)."""
    return sp.needs_history or bool(sp.logit_bias) or bans


@dataclass(slots=True)
class LogitsProcessing:
    """One step's processed rows: `plan` (kernels/penalties.ProcessPlan, rows with a history first) and the
    token history the sampled ids are added to (`record`)."""

    plan: ProcessPlan
    history: TokenHistory | None

    @staticmethod
    def host_lists(
        params: list[SamplingParams], rows: list[int], hist: list[int], bans: list[bool]
    ) -> list[list[float]]:
        """The plan's per-row fields as lists of numbers for ONE host->device copy (`from_device` reads them back):
        rows[i] is a logits row, hist[i] its table row, bans[i] whether its stop set is banned now (`bans_now`)."""
        return [
            rows,
            hist,
            [params[j].repetition_penalty for j in rows],
            [params[j].frequency_penalty for j in rows],
            [params[j].presence_penalty for j in rows],
            [1 if ban else 0 for ban in bans],
        ]

    @classmethod
    def from_device(cls, parts: list[torch.Tensor], num_history: int, history: TokenHistory) -> LogitsProcessing:
        """`host_lists`' parts, as float64 tensors on the device, -> the plan in its dtypes, over `history`."""
        rows, hist, rep, freq, pres, ban_on = parts
        return cls(
            plan=ProcessPlan(
                rows=rows.long(),
                hist=hist.long(),
                rep=rep.float(),
                freq=freq.float(),
                pres=pres.float(),
                ban_on=ban_on.long(),
                bias_tok=history.bias_tok,
                bias_val=history.bias_val,
                bias_len=history.bias_len,
                ban_tok=history.ban_tok,
                ban_len=history.ban_len,
                num_history=num_history,
                counts=history.counts if num_history else None,
            ),
            history=history,
        )

    def apply(self, logits: torch.Tensor, triton: bool | None = None) -> torch.Tensor:
        """fp32 [P, V]: the processed rows of `logits` ([N, V], model dtype). triton None: kernels.use_triton."""
        if use_triton(logits) if triton is None else triton:
            return process_rows(logits, self.plan)
        return process_rows_torch(logits, self.plan)

    def record(self, ids: torch.Tensor) -> None:
        """Add the tokens just sampled for the processed rows (`ids`: [P], in plan order) to their histories, on
        the device."""
        h = self.plan.num_history
        if h:
            counts = self.plan.counts
            one = torch.ones(h, dtype=torch.int32, device=counts.device)
            counts.index_put_((self.plan.hist[:h], ids[:h]), one, accumulate=True)
