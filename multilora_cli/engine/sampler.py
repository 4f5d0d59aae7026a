"""`Sampler`: logits -> next token ids; greedy, temperature, top-k, top-p, min-p, and per-row logits processing
(logit_bias, penalties, min_tokens: engine/logits_processing.py); batch-composition invariant.

Each sampled row draws ONE uniform number u = hash(seed, position) (SplitMix64, computed on the host; no
device RNG state) and picks the token by inverse CDF over its kept tokens in vocabulary order: the first token
whose running sum of weights exceeds u * total. Which tokens are kept is defined by the logits' order, not by a
sorted copy (kernels/sample.py): top-k keeps the keys >= the k-th largest (ties kept, as transformers'
warper does), top-p then keeps each token whose strictly larger kept mass is < top_p of the kept total
(transformers' order: temperature, then top-k, then top-p on the renormalised top-k distribution), and min-p
keeps the tokens whose probability is >= min_p times the top one's (transformers' MinPLogitsWarper, after
top-p). On CUDA a Triton kernel finds both thresholds by radix search over chunks of each row, with no sort;
elsewhere the same definition runs as torch ops. temperature 0 (greedy) and top_k 1 are argmax.

Rows whose logits are processed this step (a penalty, a logit_bias, or min_tokens still banning a token) are
drawn by a second launch whose passes process each logit as they load it (kernels/sample.py, PROCESS: nothing
is written but the draw; the torch path and greedy processed rows gather an fp32 copy instead); the other rows
are drawn from the model's logits as they are, and nothing is processed when no row asks for it. Whether a row is processed
depends only on its own parameters and position, so a row's token depends only on its logits, its
SamplingParams, its history, its seed and its position, never on the other rows. The only host sync is the
caller reading the ids.

Structured output: a batch carrying a `grammar` mask (engine/grammar/rows.py) draws from a copy of the logits
whose constrained rows have -inf at every token their grammar disallows (kernels/bitmask.py), before any other
processing; the logits passed in stay the raw model's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.grammar.rows import GrammarMask
from multilora_cli.engine.logits_processing import LogitsProcessing, TokenHistory, bans_now, needs_processing
from multilora_cli.engine.sequence import Sequence, splitmix64
from multilora_cli.kernels import use_triton
from multilora_cli.kernels.penalties import ProcessPlan
from multilora_cli.kernels.sample import TOPK_PATH_MAX, sample_rows, sample_rows_torch

_MASK64 = (1 << 64) - 1


@functools.lru_cache(maxsize=1 << 16)
def _mixed_seed(seed: int) -> int:
    """splitmix64 of the seed, once per seed (a sequence draws at every step: half of `uniform`'s host time)."""
    return splitmix64(seed & _MASK64)


def uniform(seed: int, position: int) -> float:
    """u in [0, 1) with 53 random bits, a pure function of (seed, position)."""
    x = splitmix64(_mixed_seed(seed) ^ (position & _MASK64))
    return (x >> 11) * (1.0 / (1 << 53))


@dataclass(slots=True)
class Draws:
    """Rows drawn from one logits tensor: greedy rows, and the sampled rows with their parameters."""

    greedy_rows: torch.Tensor  # [G] long: temperature 0 or top_k 1
    rows: torch.Tensor  # [S] long: temperature > 0
    temp: torch.Tensor  # [S] float32
    top_k: torch.Tensor  # [S] long (vocab size when off)
    top_p: torch.Tensor  # [S] float32 (1 when off)
    min_p: torch.Tensor  # [S] float32 (0 when off)
    u: torch.Tensor  # [S] float64
    any_top_k: bool = True  # some sampled row filters by top-k / top-p / min-p: the kernel's work for it runs
    any_top_p: bool = True
    any_min_p: bool = True
    # the first num_topk sampled rows take the kernel's top-k path (their own top_k < V and <= TOPK_PATH_MAX),
    # the others its full path: each row's path is its own, never its batch's
    num_topk: int = 0
    max_top_k: int = 1  # the largest top_k of those first num_topk rows

    @staticmethod
    def host_lists(params: list[SamplingParams], u: list[float], vocab_size: int) -> tuple[list[list], dict]:
        """(lists of numbers for the one host->device copy, the flags) for rows with `params` and draws `u`,
        numbered 0.. in that order (the sampled rows: top-k path rows first)."""
        g, s = [], []
        for i, sp in enumerate(params):
            (g if sp.greedy or sp.top_k == 1 else s).append(i)
        k = [min(params[i].top_k, vocab_size) or vocab_size for i in s]
        topk = [x < vocab_size and x <= TOPK_PATH_MAX for x in k]
        s = [i for i, t in zip(s, topk) if t] + [i for i, t in zip(s, topk) if not t]
        k = [x for x, t in zip(k, topk) if t] + [x for x, t in zip(k, topk) if not t]
        num_topk = sum(topk)
        lists = [
            g,
            s,
            [params[i].temperature for i in s],
            k,
            [params[i].top_p for i in s],
            [params[i].min_p for i in s],
            [u[i] for i in s],
        ]
        flags = dict(
            any_top_k=any(x < vocab_size for x in k),
            any_top_p=any(params[i].top_p < 1.0 for i in s),
            any_min_p=any(params[i].min_p > 0.0 for i in s),
            num_topk=num_topk,
            max_top_k=max(k[:num_topk], default=1),
        )
        return lists, flags

    @classmethod
    def from_device(cls, parts: list[torch.Tensor], flags: dict) -> Draws:
        g, s, temp, k, top_p, min_p, u = parts
        return cls(g.long(), s.long(), temp.float(), k.long(), top_p.float(), min_p.float(), u, **flags)


def to_device(lists: list[list], device: torch.device | str) -> list[torch.Tensor]:
    """Lists of numbers -> float64 tensors on `device`, in ONE host->device copy (exact for these values: ids and
    counts are integers < 2^53, the float fields round to float32 afterwards as from the Python float)."""
    host = torch.tensor([v for part in lists for v in part], dtype=torch.float64)
    return list(host.to(torch.device(device), non_blocking=True).split([len(p) for p in lists]))


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling inputs on the logits' device: `plain` rows (indices into the logits), and the rows
    processed this step (`processing`, None when none is), drawn from their processed copy by `processing_draws`
    (indices into that copy)."""

    plain: Draws
    num_rows: int
    processing: LogitsProcessing | None = None
    processing_draws: Draws | None = None
    grammar: GrammarMask | None = None  # structured output: the constrained rows' token mask (engine/grammar/)

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        seeds: list[int],
        positions: list[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
        *,
        history_rows: list[int] | None = None,
        history: TokenHistory | None = None,
        eos_token_ids=(),
    ) -> SamplingBatch:
        """Rows with `params`, each drawing at (seed, position). history_rows: each row's row of `history`
        (-1: none), required where a row's logits are processed (its bias and stop set are read from there);
        eos_token_ids: what min_tokens bans besides each row's stop_token_ids. Every field goes to `device` in
        one copy."""
        u = [0.0 if sp.greedy or sp.top_k == 1 else uniform(sd, pos) for sp, sd, pos in zip(params, seeds, positions)]
        proc = []
        if any(sp.processes_logits for sp in params):
            bans = [bans_now(sp, pos, eos_token_ids) for sp, pos in zip(params, positions)]
            proc = [i for i, sp in enumerate(params) if needs_processing(sp, bans[i])]
        if not proc:
            lists, flags = Draws.host_lists(params, u, vocab_size)
            return cls(Draws.from_device(to_device(lists, device), flags), len(params))
        hist = history_rows if history_rows is not None else [-1] * len(params)
        if history is None and not any(params[i].needs_history for i in proc):
            # (tests, tools) rows with a bias or bans only: a table of their own, written now
            history, hist = TokenHistory(len(proc), vocab_size, device), list(hist)
            history.write_tables([(params[i], k) for k, i in enumerate(proc)], eos_token_ids)
            for k, i in enumerate(proc):
                hist[i] = k
        if history is None or any(hist[i] < 0 for i in proc):
            raise ValueError("SamplingBatch.build: a processed row (a penalty: always) needs its token history row")
        proc.sort(key=lambda i: not params[i].needs_history)  # rows with a penalty first (stable: batch order)
        num_history = sum(params[i].needs_history for i in proc)
        taken = set(proc)
        plain = [i for i in range(len(params)) if i not in taken]
        plain_lists, plain_flags = Draws.host_lists([params[i] for i in plain], [u[i] for i in plain], vocab_size)
        plain_lists[0] = [plain[j] for j in plain_lists[0]]  # greedy and sampled rows: back to logits rows
        plain_lists[1] = [plain[j] for j in plain_lists[1]]
        proc_lists, proc_flags = Draws.host_lists([params[i] for i in proc], [u[i] for i in proc], vocab_size)
        plan_lists = LogitsProcessing.host_lists(params, proc, [hist[i] for i in proc], [bans[i] for i in proc])
        parts = to_device(plain_lists + proc_lists + plan_lists, device)
        n, m = len(plain_lists), len(proc_lists)
        return cls(
            plain=Draws.from_device(parts[:n], plain_flags),
            num_rows=len(params),
            processing=LogitsProcessing.from_device(parts[n + m :], num_history, history),
            processing_draws=Draws.from_device(parts[n : n + m], proc_flags),
        )

    @classmethod
    def for_seqs(
        cls,
        seqs: list[Sequence],
        vocab_size: int,
        device: torch.device | str = "cpu",
        ahead: bool = False,
        *,
        history: TokenHistory | None = None,
        eos_token_ids=(),
    ) -> SamplingBatch:
        """Rows = `seqs` (e.g. `ScheduledBatch.sampled_seqs()`), each at its `sample_position`; `ahead`: one
        position further (a step launched before the previous step's token reached the host:
        `ScheduledBatch.ahead`). `history`: the runner's TokenHistory, which gives (and writes, on a sequence's
        first sampled step) the rows of sequences that process their logits."""
        step = 1 if ahead else 0
        rows = None
        if history is not None and any(s.sampling.processes_logits for s in seqs):
            rows = history.rows_for(seqs, ahead, eos_token_ids)
        return cls.build(
            [s.sampling for s in seqs],
            [s.seed for s in seqs],
            [s.sample_position + step for s in seqs],
            vocab_size,
            device,
            history_rows=rows,
            history=history,
            eos_token_ids=eos_token_ids,
        )


def _draw(logits: torch.Tensor, d: Draws, out: torch.Tensor, triton: bool, plan: ProcessPlan | None = None) -> None:
    """out[r] for the rows of `d`, drawn from `logits` (rows indexed as in `d`). `plan` (Triton only, no greedy
    rows): `d` indexes the plan's rows and draws from their processed logits, fused into the kernel's passes."""
    if d.greedy_rows.numel():
        out[d.greedy_rows] = logits[d.greedy_rows].argmax(dim=-1)
    if d.rows.numel():
        if triton:
            v, n, s = logits.shape[1], d.num_topk, d.rows.numel()
            for part, topk in ((slice(0, n), True), (slice(n, None), False)):  # (views: no copy, no launch)
                if (n if topk else s - n) == 0:
                    continue
                # (a batch on one path, the usual case, takes its fields whole: 6 slices cost host time per step)
                f = [d.rows, d.temp, d.top_k, d.top_p, d.u, d.min_p]
                if n not in (0, s):
                    f = [t[part] for t in f]
                sample_rows(
                    logits,
                    f[0],
                    f[1],
                    f[2],
                    f[3],
                    f[4],
                    out,
                    min_p=f[5],
                    plan=plan,
                    any_top_k=d.any_top_k,
                    any_top_p=d.any_top_p,
                    any_min_p=d.any_min_p,
                    max_top_k=d.max_top_k if topk else v,
                    topk_path_max=TOPK_PATH_MAX if topk else 0,
                )
        else:
            min_p = d.min_p if d.any_min_p else None
            out[d.rows] = sample_rows_torch(logits[d.rows], d.temp, d.top_k, d.top_p, d.u, min_p)


class Sampler:
    """`sampler(logits, batch) -> LongTensor [B]` of next token ids (on the logits' device). Stateless itself: a
    batch with penalties adds its sampled ids to the token history it carries. `triton`: the Triton kernels
    (True) or the torch ops (False) whatever the device; None: kernels.use_triton decides (CUDA: Triton)."""

    def __init__(self, triton: bool | None = None):
        self.triton = triton

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        # logits: [B, V] (any float dtype: the model's is read as it is; weights are computed in float32)
        if logits.shape[0] != batch.num_rows:
            raise ValueError(f"logits have {logits.shape[0]} rows, sampling batch has {batch.num_rows}")
        triton = use_triton(logits) if self.triton is None else self.triton
        # structured output: draws from a masked copy; `logits` stay the raw model's (what logprobs report)
        drawn = logits if batch.grammar is None else batch.grammar.apply(logits, triton)
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        _draw(drawn, batch.plain, out, triton)
        proc = batch.processing
        if proc is not None:
            d = batch.processing_draws
            ids = torch.empty(proc.plan.num_rows, dtype=torch.long, device=logits.device)
            if triton and not d.greedy_rows.numel():
                _draw(drawn, d, ids, True, proc.plan)  # processed inside the sampling passes: no [P, V] copy
            else:  # greedy rows take the argmax of an fp32 [P, V] processed copy
                _draw(proc.apply(drawn, triton), d, ids, triton)
            out[proc.plan.rows] = ids
            proc.record(ids)
        return out
