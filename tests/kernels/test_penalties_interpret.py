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
    p = len(rows)
    counts = None
    hist = [-1] * p
    if with_counts:
        counts = torch.randint(0, 4, (6, v), generator=g, dtype=torch.int32)  # generated counts
        counts |= torch.where(torch.rand(6, v, generator=g) < 0.2, SEEN_IN_PROMPT, 0).int()
        counts[:, : v // 3] = torch.where(torch.rand(6, v // 3, generator=g) < 0.7, 0, counts[:, : v // 3])
        hist[:num_history] = [5, 0, 3, 2][:num_history]
    bias, ban = [], []
    for i in range(p):
        toks = sorted(torch.randperm(v, generator=g)[: i % 4].tolist())
        bias.append([(t, float(b)) for t, b in zip(toks, [100.0, -100.0, 2.5, -0.75])])
        ban.append(sorted(torch.randperm(v, generator=g)[: (i + 1) % 3].tolist()))

    def csr(lists):
        start = [0]
        for x in lists:
            start.append(start[-1] + len(x))
        return torch.tensor(start)

    def dev(t):
        return t.to(DEV)

    return ProcessPlan(
        rows=dev(torch.tensor(rows)),
        hist=dev(torch.tensor(hist)),
        rep=dev(torch.tensor([1.3, 0.7, 1.0, 2.0, 1.1][:p])),
        freq=dev(torch.tensor([0.5, -2.0, 0.0, 1.25, 0.3][:p])),
        pres=dev(torch.tensor([2.0, 0.4, 0.0, -1.5, 0.0][:p])),
        bias_start=dev(csr(bias)),
        bias_tok=dev(torch.tensor([t for b in bias for t, _ in b], dtype=torch.long)),
        bias_val=dev(torch.tensor([x for b in bias for _, x in b], dtype=torch.float32)),
        bias_row=dev(torch.tensor([i for i, b in enumerate(bias) for _ in b], dtype=torch.long)),
        ban_start=dev(csr(ban)),
        ban_tok=dev(torch.tensor([t for b in ban for t in b], dtype=torch.long)),
        ban_row=dev(torch.tensor([i for i, b in enumerate(ban) for _ in b], dtype=torch.long)),
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
    p.bias_start.zero_()
    p.ban_start.zero_()
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
        up = [i for i in range(n) if (p.bias_val.cpu()[p.bias_start[i] : p.bias_start[i + 1]] == 100).any()]
        for i in up:  # its +100 token (not banned) is the only one min-p keeps
            t = p.bias_tok.cpu()[p.bias_start[i]].item()
            if not torch.isinf(proc[i, t]):
                assert want[i].item() == t


def test_many_entries_across_blocks():
    """A row biasing and banning hundreds of tokens spread over several kernel blocks: each block finds its own
    entries (binary search over the row's sorted tokens), none is lost or applied twice."""
    v = 5000
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, v, generator=g) * 3).to(DEV)
    p = plan(v, [1, 0], 1, g)
    toks = torch.randperm(v, generator=g)
    bias = sorted(toks[:500].tolist())
    ban = sorted(toks[500:800].tolist())
    vals = (torch.rand(500, generator=g) * 200 - 100).tolist()
    p.bias_start = torch.tensor([0, 500, 500], device=DEV)
    p.bias_tok = torch.tensor(bias, device=DEV)
    p.bias_val = torch.tensor(vals, dtype=torch.float32, device=DEV)
    p.bias_row = torch.zeros(500, dtype=torch.long, device=DEV)
    p.ban_start = torch.tensor([0, 0, 300], device=DEV)
    p.ban_tok = torch.tensor(ban, device=DEV)
    p.ban_row = torch.ones(300, dtype=torch.long, device=DEV)
    got, want = process_rows(x, p), process_rows_torch(x, p)
    torch.testing.assert_close(got, want, rtol=0 if DEV == "cpu" else 1e-6, atol=0 if DEV == "cpu" else 1e-5)
    assert torch.isinf(want[1]).sum() == 300 and not torch.isinf(want[0]).any()
