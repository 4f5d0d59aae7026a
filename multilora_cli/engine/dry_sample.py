"""The launches after the forward that a run's lines can make (config.LineKind), recorded for the precompile.

A step samples its rows in up to two groups (engine/sampler.py): the rows drawn from the raw logits, and the rows
processed this step (a penalty, a logit_bias, min_tokens banning the stop set). Each group calls
kernels/sample.sample_rows once per path (the top-k path: every row's top_k in 2..TOPK_PATH_MAX; the full
path), and what makes a variant of its passes is fixed per call by the group's rows: WITH_MIN_P (some row has a
min_p), the full path's top-k and top-p passes (some row has a top_k / a top_p), PROCESS and WITH_COUNTS (a
processed group drawn from the model's logits; some row with a penalty). A processed group holding a greedy row
is instead processed into an fp32 copy (kernels/penalties.process_rows) that its sampled rows are drawn from
unprocessed. Logprob rows (kernels/logprobs.py) vary by k, the grammar mask (kernels/bitmask.py) by nothing.

So the variants a group can launch follow from the kinds of the lines that can land in it, taken together: the
sets below are what some step of those lines can launch (a little more: any two kinds may meet in a step). The
demo's lines (greedy, one top-p, one top-k row, no processing) need 8 sampling variants; the old dry run
compiled 16 whatever the input, and missed the ones with min_p or without a penalty's counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from multilora_cli.config import LineKind
from multilora_cli.kernels.penalties import ProcessPlan, process_rows
from multilora_cli.kernels.sample import TOPK_PATH_MAX, sample_rows

# an input whose lines are not known (stdin, a large file): sampled rows on both paths, with and without a
# penalty, logprobs 0 and 5, a base row (what the dry run covered before the kinds were known)
UNKNOWN = frozenset(
    {
        LineKind(base=True, sampled=True, top_k=50),
        LineKind(sampled=True, top_p=True),
        LineKind(sampled=True, top_k=50, penalty=True),
        LineKind(sampled=True, top_p=True, penalty=True),
        LineKind(logprobs=5),
        LineKind(prompt_logprobs=0),
    }
)


@dataclass(frozen=True, slots=True)
class SampleLaunch:
    """One sample_rows call: the path, the full path's filter passes, WITH_MIN_P, the plan (None: none; else
    whether it has token counts), and whether the logits are the processed fp32 copy."""

    topk_path: bool
    any_top_k: bool
    any_top_p: bool
    min_p: bool
    counts: bool | None
    fp32: bool = False


def _topk_path(kind: LineKind, vocab: int) -> bool:
    k = min(kind.top_k, vocab) or vocab
    return k < vocab and k <= TOPK_PATH_MAX


def _group(lines: list[LineKind], vocab: int, counts: Iterable[bool | None], fp32: bool = False) -> set:
    """The calls a group of sampled `lines` can make, for each plan kind in `counts`."""
    if not lines:
        return set()
    any_k = any(0 < min(k.top_k, vocab) < vocab for k in lines)
    any_p = any(k.top_p for k in lines)
    out = set()
    for path in {_topk_path(k, vocab) for k in lines}:
        for w in {k.min_p for k in lines}:
            for c in counts:  # the top-k path's passes do not depend on the flags: one key for them
                out.add(SampleLaunch(path, path or any_k, not path and any_p, w, c, fp32))
    return out


def sample_launches(kinds: Iterable[LineKind], vocab: int) -> tuple[set[SampleLaunch], set[bool]]:
    """(sample_rows calls, WITH_COUNTS of process_rows calls) that steps of lines of `kinds` can make."""
    kinds = list(kinds)
    raw = [k for k in kinds if k.sampled and not (k.penalty or k.bias)]  # min_tokens: raw once it stops banning
    proc = [k for k in kinds if k.processed]
    proc_sampled = [k for k in proc if k.sampled]
    calls = _group(raw, vocab, [None])
    calls |= _group(proc_sampled, vocab, {k.penalty for k in proc_sampled})  # fused: no greedy row in the group
    processed = set()
    if any(not k.sampled for k in proc):  # a greedy processed row: the group goes through an fp32 copy
        processed = {k.penalty for k in proc}
        calls |= _group(proc_sampled, vocab, [None], fp32=True)
    return calls, processed


def logprob_ks(kinds: Iterable[LineKind]) -> set[int]:
    """The k of every logprob rows call (sampled tokens' and prompts'; a step's k is one of its rows')."""
    return {k for kind in kinds for k in (kind.logprobs, kind.prompt_logprobs) if k is not None}


def _plan(device: torch.device, vocab: int, counts: bool) -> ProcessPlan:
    """A one-row plan shaped as the runner's (its tables 8 wide), with token counts or without."""
    one = torch.zeros(1, device=device)
    ids = one.long()
    table = torch.zeros(1, 8, dtype=torch.int64, device=device)
    return ProcessPlan(
        rows=ids,
        hist=ids,
        rep=one + 1,
        freq=one,
        pres=one,
        ban_on=ids,
        bias_tok=table,
        bias_val=table.float(),
        bias_len=ids,
        ban_tok=table,
        ban_len=ids,
        num_history=int(counts),
        counts=torch.zeros(1, vocab, dtype=torch.int32, device=device) if counts else None,
    )


def dry_sample(logits: torch.Tensor, kinds: Iterable[LineKind] | None) -> None:
    """Make (inside kernels.launch.collect: record) every launch after the forward that steps of lines of `kinds`
    (None: UNKNOWN) can make, on `logits` shaped as the runner's ([N, V], the model's dtype, contiguous): the
    sampler's, the logits processing's, the logprob rows' at each k, the grammar mask's."""
    kinds = list(UNKNOWN if kinds is None else kinds)
    dev, v = logits.device, logits.shape[1]
    one = torch.zeros(1, device=dev)
    ids = one.long()
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=dev)
    calls, processed = sample_launches(kinds, v)
    for c in processed:
        process_rows(logits, _plan(dev, v, c))
    for call in sorted(calls, key=repr):  # (a fixed order: the tests compare recordings)
        k = 50 if call.topk_path else v
        x = logits.float() if call.fp32 else logits
        sample_rows(
            x, ids, one + 1, ids + k, one + (0.5 if call.any_top_p else 1.0), one.double(), out,
            min_p=one + 0.1 if call.min_p else None,
            plan=None if call.counts is None else _plan(dev, v, call.counts),
            any_top_k=call.any_top_k, any_top_p=call.any_top_p, any_min_p=call.min_p, max_top_k=k,
            topk_path_max=TOPK_PATH_MAX if call.topk_path else 0,
        )  # fmt: skip
    for k in sorted(logprob_ks(kinds)):
        from multilora_cli.kernels.logprobs import logprob_rows_triton  # (only for lines asking for logprobs)

        logprob_rows_triton(torch.zeros(1, v, device=dev), ids, k)  # [1, V] fp32, as the runner's
    if any(k.constrained for k in kinds):
        from multilora_cli.kernels.bitmask import apply_bitmask

        apply_bitmask(logits.clone(), ids, torch.zeros(1, -(-v // 32), dtype=torch.int32, device=dev))
