"""Logits processing (engine/logits_processing.py) on the logits themselves: each field against transformers'
processor or a float64 reference of OpenAI's formula, rows processed only when they ask, and the device token
history's rows (written from the host at a sequence's first sampled step and after each preemption, updated
from the sampled ids, taken back from sequences no longer running)."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.logits_processing import TokenHistory
from multilora_cli.engine.request import Request
from multilora_cli.engine.sampler import Sampler, SamplingBatch
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.errors import EngineError
from multilora_cli.kernels.penalties import SEEN_IN_PROMPT
from tests.devices import KERNEL_DEVICE

V = 40


def seq(i: int, prompt, out=(), **sp) -> Sequence:
    s = Sequence.from_request(i, Request(key=i, id=str(i), sampling=SamplingParams(max_tokens=50, **sp)), prompt)
    s.token_ids += list(out)
    s.status = SeqStatus.RUNNING
    return s


def logits(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g) * 3


def processed(x: torch.Tensor, seqs, history=None, eos=()) -> tuple[torch.Tensor, SamplingBatch]:
    """The processed logits the sampler draws from, scattered back to [B, V] (unprocessed rows: raw)."""
    history = history or TokenHistory(8, V, "cpu")
    b = SamplingBatch.for_seqs(seqs, V, history=history, eos_token_ids=eos)
    full = x.clone()
    if b.processing is not None:
        full[b.processing.plan.rows] = b.processing.apply(x)
    return full, b


def test_each_field_equals_transformers_processors():
    from transformers.generation.logits_process import (
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
    )

    x = logits(3, seed=1)
    prompt, out = [4, 5, 6, 5], [7, 4, 9]
    seqs = [
        seq(0, prompt, out, repetition_penalty=1.3),
        seq(1, prompt, out, logit_bias={"3": 2.5, 8: -7}, repetition_penalty=0.8),
        seq(2, prompt, out, min_tokens=5, stop_token_ids=[11]),
    ]
    got, _ = processed(x, seqs, eos=[2])
    ids = torch.tensor([prompt + out])
    want0 = RepetitionPenaltyLogitsProcessor(1.3)(ids, x[0:1].clone())
    want1 = SequenceBiasLogitsProcessor([[[3], 2.5], [[8], -7.0]])(ids, x[1:2].clone())
    want1 = RepetitionPenaltyLogitsProcessor(0.8)(ids, want1)
    want2 = MinNewTokensLengthLogitsProcessor(len(prompt), 5, [2, 11])(ids, x[2:3].clone())
    assert torch.equal(got, torch.cat([want0, want1, want2]))


def test_openai_penalties_and_bias_equal_a_float64_reference():
    x = logits(2, seed=2)
    prompt, out = [1, 2, 3, 3], [3, 9, 9, 9, 12]
    fields = [
        dict(frequency_penalty=0.7, presence_penalty=-1.2, logit_bias={"9": 100, "30": -100}),
        dict(frequency_penalty=-2.0, presence_penalty=2.0, repetition_penalty=1.5, logit_bias={"1": -3}),
    ]
    got, _ = processed(x, [seq(i, prompt, out, **f) for i, f in enumerate(fields)])
    for i, f in enumerate(fields):
        sp = SamplingParams(**f)
        ref = x[i].double().clone()
        for t, b in sp.logit_bias.items():
            ref[t] += b
        seen = torch.zeros(V, dtype=torch.bool)
        seen[prompt + out] = True
        p = sp.repetition_penalty
        ref = torch.where(seen, torch.where(ref > 0, ref / p, ref * p), ref)
        count = torch.bincount(torch.tensor(out), minlength=V).double()
        ref -= sp.frequency_penalty * count + sp.presence_penalty * (count > 0).double()
        torch.testing.assert_close(got[i].double(), ref, rtol=1e-6, atol=1e-5)


def test_rows_without_parameters_are_not_processed():
    x = logits(4, seed=3)
    seqs = [seq(0, [1]), seq(1, [1], temperature=0.5, min_p=0.1), seq(2, [1], min_tokens=2), seq(3, [1], min_tokens=1)]
    seqs[3].token_ids.append(5)  # its one min_token is out: nothing banned any more
    _, b = processed(x, seqs, eos=[2])
    assert b.processing.plan.rows.tolist() == [2]  # only the row still banning eos
    _, b = processed(x, [seq(0, [1]), seq(1, [1], temperature=0.5, min_p=0.1)])
    assert b.processing is None
    _, b = processed(x[:1], [seq(0, [1], min_tokens=3, ignore_eos=True)], eos=[2])
    assert b.processing is None  # nothing to ban: eos is an ordinary token, no stop_token_ids


def test_history_rows_are_written_updated_and_handed_on():
    h = TokenHistory(2, V, "cpu")
    a, b, c = seq(0, [4, 4, 6], [7, 7], frequency_penalty=1), seq(1, [8], presence_penalty=1), seq(2, [9])
    assert h.rows_for([a, b, c]) == [0, 1, -1] and h.counts.dtype == torch.int32
    assert h.counts[0, 4].item() == SEEN_IN_PROMPT and h.counts[0, 7].item() == 2 and h.counts[0, 6] == SEEN_IN_PROMPT
    assert h.counts[1].nonzero().flatten().tolist() == [8]
    # the sampler adds each draw on the device; an ahead step finds the rows there
    before = h.counts.clone()
    ids = Sampler()(logits(2), SamplingBatch.for_seqs([a, b], V, ahead=True, history=h))
    added = torch.zeros_like(before)
    added[[0, 1], ids] = 1
    assert torch.equal(h.counts, before + added)
    with pytest.raises(EngineError, match="runs ahead without its token history"):
        h.rows_for([seq(5, [1], repetition_penalty=1.2)], ahead=True)
    # no row free: the rows of sequences no longer running are taken back
    with pytest.raises(EngineError, match="more than 2 running sequences"):
        h.rows_for([seq(3, [1], repetition_penalty=1.2)])
    b.status = SeqStatus.FINISHED
    d = seq(4, [3, 3], [5], repetition_penalty=1.2)
    assert h.rows_for([d]) == [1] and h.counts[1].nonzero().flatten().tolist() == [3, 5]
    # after a preemption the row is rewritten from the host's tokens, whatever the device added meanwhile
    h.counts[0].fill_(77)
    a.num_preemptions += 1
    assert h.rows_for([a]) == [0]
    assert h.counts[0, 4].item() == SEEN_IN_PROMPT and h.counts[0, 7].item() == 2 and (h.counts[0] == 77).sum() == 0
    assert h.rows_in_use == 2


def test_rows_with_a_penalty_need_their_history():
    with pytest.raises(ValueError, match="needs its token history row"):
        SamplingBatch.build([SamplingParams(repetition_penalty=1.1)], [0], [0], V)


@pytest.mark.skipif(KERNEL_DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on CPU")
@pytest.mark.parametrize("top_k", [0, 12])  # 0: the kernel's full path; 12 on every row: its top-k path
def test_fused_kernel_draws_what_the_torch_path_draws(top_k):
    """The Triton sampler (processing inside the sampling passes, bias and stop sets read from the sequence
    table) against the torch path (an fp32 processed copy): the same ids over several steps, each step's draw
    added to both histories alike. Interpreter on the CPU, the kernels on a GPU."""
    dev = KERNEL_DEVICE
    fields = [
        dict(repetition_penalty=1.4, logit_bias={"3": 4.0, 17: -2.5}),
        dict(frequency_penalty=0.8, presence_penalty=-0.5, min_tokens=4, stop_token_ids=[9]),
        dict(logit_bias={"5": 100}, min_p=0.05),
        dict(min_tokens=3, top_p=0.8),
    ]
    ids = {}
    for triton in (False, True):
        h = TokenHistory(6, V, dev)
        seqs = [seq(i, [4, 1, 4], [7], temperature=0.9, top_k=top_k, **f) for i, f in enumerate(fields)]
        got = []
        for step in range(3):
            b = SamplingBatch.for_seqs(seqs, V, dev, history=h, eos_token_ids=[2])
            t = Sampler(triton)(logits(len(seqs), seed=step).to(dev), b).cpu().tolist()
            for s, tok in zip(seqs, t):
                s.token_ids.append(tok)
            got.append(t)
        ids[triton] = (got, h.counts.cpu())
    assert ids[True][0] == ids[False][0]
    assert torch.equal(ids[True][1], ids[False][1])
    assert all(t[2] == 5 for t in ids[True][0])  # +100 wins every draw min-p allows


def test_bias_and_stop_sets_are_written_once_per_sequence():
    """A sequence's logit_bias and stop set go to its table row at its first step only (a step sends no entries);
    a bias-only sequence met first in an ahead step gets its row (it needs no host tokens)."""
    h = TokenHistory(3, V, "cpu")
    a = seq(0, [1], logit_bias={"6": 1.5, "2": -1.0}, min_tokens=2, stop_token_ids=[8])
    assert h.rows_for([a], eos_token_ids=[2]) == [0]
    assert h.bias_tok[0, :2].tolist() == [2, 6] and h.bias_len[0] == 2 and h.bias_val[0, :2].tolist() == [-1.0, 1.5]
    assert h.ban_tok[0, : h.ban_len[0]].tolist() == [2, 8]
    h.bias_val[0, 0] = 7.0  # a later step does not write the row again
    SamplingBatch.for_seqs([a], V, history=h, eos_token_ids=[2])
    assert h.bias_val[0, 0] == 7.0
    b = seq(1, [1], logit_bias={str(t): 1.0 for t in range(20)})  # wider than the table: it widens, a's row kept
    assert h.rows_for([a, b], ahead=True) == [0, 1]
    assert h.bias_tok.shape[1] >= 20 and h.bias_val[0, 0] == 7.0 and h.bias_len[1] == 20
