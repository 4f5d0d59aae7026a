"""The logits-processing kernel (kernels/penalties.py) against its torch definition, bit for bit under the
interpreter: fp32 / bf16 logits, rows picked out of order, rows with and without a history, logit_bias up to
+-100, bans (-inf), and the sampling kernel drawing from the processed rows (min-p among them) as the torch path
does."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.penalties import SEEN_IN_PROMPT, ProcessPlan, process_rows, process_rows_torch
from multilora_cli.kernels.sample import sample_rows, sample_rows_torch
from tests.devices import KERNEL_DEVICE as DEV


def plan(v: int, rows: list[int], num_history: int, g: torch.Generator, with_counts: bool = True) -> ProcessPlan:
    """Plan row i on table row hist[i] (6 table rows, as the engine's sequence table), the first num_history
    with a penalty; plan row i biases i % 4 tokens and bans (i + 1) % 3 (its stop set, banned now)."""
    p = len(rows)
    counts = None
    hist = [5, 0, 3, 2, 4][:p]
    if with_counts:
        counts = torch.randint(0, 4, (6, v), generator=g, dtype=torch.int32)  # generated counts
        counts |= torch.where(torch.rand(6, v, generator=g) < 0.2, SEEN_IN_PROMPT, 0).int()
        counts[:, : v // 3] = torch.where(torch.rand(6, v // 3, generator=g) < 0.7, 0, counts[:, : v // 3])
    bias_tok, bias_val = torch.zeros(6, 4, dtype=torch.long), torch.zeros(6, 4)
    ban_tok = torch.zeros(6, 2, dtype=torch.long)
    bias_len, ban_len = torch.zeros(6, dtype=torch.long), torch.zeros(6, dtype=torch.long)
    for i, t in enumerate(hist):
        toks = sorted(torch.randperm(v, generator=g)[: i % 4].tolist())
        bias_tok[t, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        bias_val[t, : len(toks)] = torch.tensor([100.0, -100.0, 2.5, -0.75][: len(toks)])
        bias_len[t] = len(toks)
        ban = sorted(torch.randperm(v, generator=g)[: (i + 1) % 3].tolist())
        ban_tok[t, : len(ban)] = torch.tensor(ban, dtype=torch.long)
        ban_len[t] = len(ban)

    def dev(t):
        return t.to(DEV)

    return ProcessPlan(
        rows=dev(torch.tensor(rows)),
        hist=dev(torch.tensor(hist)),
        rep=dev(torch.tensor([1.3, 0.7, 1.0, 2.0, 1.1][:p])),
        freq=dev(torch.tensor([0.5, -2.0, 0.0, 1.25, 0.3][:p])),
        pres=dev(torch.tensor([2.0, 0.4, 0.0, -1.5, 0.0][:p])),
        ban_on=dev(torch.ones(p, dtype=torch.long)),
        bias_tok=dev(bias_tok),
        bias_val=dev(bias_val),
        bias_len=dev(bias_len),
        ban_tok=dev(ban_tok),
        ban_len=dev(ban_len),
        num_history=num_history if with_counts else 0,
        counts=dev(counts) if counts is not None else None,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v,num_history,with_counts", [(50, 3, True), (3000, 4, True), (700, 0, True), (64, 0, False)])
def test_kernel_equals_torch_definition(dtype, v, num_history, with_counts):
    g = torch.Generator().manual_seed(v + num_history)
    x = (torch.randn(7, v, generator=g) * 3).to(dtype).to(DEV)
    p = plan(v, [6, 0, 3, 4, 1], num_history, g, with_counts)
    got = process_rows(x, p)
    want = process_rows_torch(x, p)
    assert got.dtype == torch.float32 and got.shape == (5, v)
    if DEV == "cpu":  # the interpreter computes as torch does; a GPU may fuse a multiply-add (an ulp apart)
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    banned = torch.isinf(want.cpu()).sum().item()
    assert banned == sum(((i + 1) % 3) for i in range(5))  # each ban is -inf, nothing else is


def test_neutral_parameters_change_no_bit():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 200, generator=g) * 4).to(DEV)
    p = plan(200, [2, 0, 1], 3, g)
    for t in (p.rep, p.freq, p.pres):
        t.fill_(1.0 if t is p.rep else 0.0)
    p.bias_len.zero_()
    p.ban_on.zero_()  # (its stop set no longer banned)
    assert torch.equal(process_rows(x, p).cpu(), x[[2, 0, 1]].cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draws_from_processed_rows_match_torch(dtype):
    """Biased (+-100) and banned (-inf) rows, sampled with min-p (and top-p / top-k on some) by the kernel and
    by the torch path: the same tokens; a +100 bias wins every draw it can."""
    v = 600
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, v, generator=g) * 3).to(dtype).to(DEV)
    p = plan(v, [4, 1, 0, 3, 2], 2, g)
    proc = process_rows(x, p)
    n = p.num_rows
    temp = torch.tensor([1.0, 0.7, 1.5, 1.0, 2.0])
    top_k = torch.tensor([v, v, 40, v, v])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.8, 1.0])
    min_p = torch.tensor([0.05, 0.1, 0.0, 0.3, 0.01])
    for seed in range(4):
        u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        out = torch.full((n,), -1, dtype=torch.long, device=DEV)
        args = [t.to(DEV) for t in (temp, top_k, top_p, u)]
        sample_rows(proc, torch.arange(n, device=DEV), *args, out, min_p=min_p.to(DEV))
        want = sample_rows_torch(proc.cpu(), temp, top_k, top_p, u, min_p)
        assert out.cpu().tolist() == want.tolist()
        assert not torch.isinf(proc.cpu().gather(1, want.unsqueeze(1))).any()  # a banned token never comes out
        hist = p.hist.cpu()
        up = [i for i in range(n) if p.bias_len[hist[i]] > 0 and p.bias_val.cpu()[hist[i], 0] == 100]
        for i in up:  # its +100 token (not banned) is the only one min-p keeps
            t = p.bias_tok.cpu()[hist[i], 0].item()
            if not torch.isinf(proc[i, t]):
                assert want[i].item() == t


@pytest.mark.parametrize("nbias,nban", [(500, 300), (30, 20)])
def test_many_entries_across_blocks(nbias, nban):
    """A row biasing and banning tens to hundreds of tokens spread over several kernel blocks: each block finds
    its own entries (counted from one load up to 32 entries, by binary search above), none is lost or applied
    twice."""
    v = 5000
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, v, generator=g) * 3).to(DEV)
    p = plan(v, [1, 0], 1, g)
    toks = torch.randperm(v, generator=g)
    bias = sorted(toks[:nbias].tolist())
    ban = sorted(toks[nbias : nbias + nban].tolist())
    vals = (torch.rand(nbias, generator=g) * 200 - 100).tolist()
    p.bias_tok = torch.zeros(6, nbias, dtype=torch.long, device=DEV)  # plan row 0 on table row 5, 1 on 0
    p.bias_val = torch.zeros(6, nbias, device=DEV)
    p.bias_tok[5] = torch.tensor(bias, device=DEV)
    p.bias_val[5] = torch.tensor(vals, dtype=torch.float32, device=DEV)
    p.bias_len = torch.tensor([0, 0, 0, 0, 0, nbias], device=DEV)
    p.ban_tok = torch.zeros(6, nban, dtype=torch.long, device=DEV)
    p.ban_tok[0] = torch.tensor(ban, device=DEV)
    p.ban_len = torch.tensor([nban, 0, 0, 0, 0, 0], device=DEV)
    got, want = process_rows(x, p), process_rows_torch(x, p)
    torch.testing.assert_close(got, want, rtol=0 if DEV == "cpu" else 1e-6, atol=0 if DEV == "cpu" else 1e-5)
    assert torch.isinf(want[1]).sum() == nban and not torch.isinf(want[0]).any()
