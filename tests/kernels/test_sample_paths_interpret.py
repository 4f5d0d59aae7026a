"""The sampling kernel's two paths and its fused processing (kernels/sample.py), against the torch definition:
the top-k path (chunk max, distance counts and the window buffered on the top 16 key bits, candidates compacted,
one program a row) and the full
path (forced by topk_path_max=0) draw the same tokens as sample_rows_torch; a row whose candidates overflow the
buffer (ties at the k-th logit) is drawn by the serial fallback, its neighbours by the buffer; and rows drawn
with a ProcessPlan (processing inside every pass, no copy) equal the torch path on the processed copy."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.penalties import process_rows_torch
from multilora_cli.kernels.sample import sample_rows, sample_rows_torch
from tests.devices import KERNEL_DEVICE as DEV
from tests.kernels.test_penalties_interpret import plan


def _draw(x, rows, temp, top_k, top_p, u, min_p, n_out, **kw):
    out = torch.full((n_out,), -7, dtype=torch.long, device=DEV)
    args = [t.to(DEV) for t in (temp, top_k, top_p, u)]
    sample_rows(x.to(DEV), rows.to(DEV), *args, out, min_p=min_p.to(DEV), **kw)
    return out.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_path_equals_full_path_and_definition(dtype):
    v, n = 600, 6
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(n, v, generator=g) * 3).to(dtype)
    x[3, 100:300] = x[3, 0]  # many ties (all of them candidates: 200 > the k below, within 2 x k's buffer)
    rows = torch.tensor([4, 0, 3, 5, 1])
    temp = torch.tensor([1.0, 0.6, 1.3, 0.9, 2.0])
    top_k = torch.tensor([40, 1, 150, 7, 100])
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.8, 1.0])
    min_p = torch.tensor([0.05, 0.0, 0.0, 0.2, 0.01])
    for seed in range(3):
        u = torch.rand(len(rows), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        want = sample_rows_torch(x[rows], temp, top_k, top_p, u, min_p)
        topk = _draw(x, rows, temp, top_k, top_p, u, min_p, n, chunk=256)
        assert topk[rows].tolist() == want.tolist()
        if seed == 0:  # the distance counts in packed registers (4 blocks a chunk here): the same counts, same draws
            packed = _draw(x, rows, temp, top_k, top_p, u, min_p, n, chunk=256, block=64, packed_counts=True)
            assert packed[rows].tolist() == want.tolist()
        if seed == 0:  # (the full path's 2 x 8 radix passes on fp32 are slow in the interpreter: once)
            full = _draw(x, rows, temp, top_k, top_p, u, min_p, n, chunk=256, topk_path_max=0)
            assert full[rows].tolist() == want.tolist()
        assert topk[2].item() == -7  # rows not asked for are untouched


def test_overflowing_rows_take_the_serial_path():
    """A buffer of 16 candidates: row 1 (60 tied logits at its 5th largest) overflows and is drawn by one program
    over its whole row; rows 0 and 2 fit and are drawn from the buffer; all three as the definition."""
    v = 300
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, v, generator=g) * 2
    x[1, 40:100] = 9.0
    x[1, [3, 7]] = 12.0  # two above the run of ties
    temp = torch.ones(3)
    top_k = torch.tensor([6, 5, 3])
    top_p = torch.tensor([0.95, 0.7, 1.0])
    min_p = torch.tensor([0.0, 0.01, 0.1])
    rows = torch.arange(3)
    picks = set()
    for seed in range(4):
        u = torch.rand(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        got = _draw(x, rows, temp, top_k, top_p, u, min_p, 3, chunk=64, candidates=16)
        assert got.tolist() == want.tolist()
        picks.add(got[1].item())
    assert picks - {3, 7}  # the serial row really drew among its ties


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk_path_max", [1024, pytest.param(0, marks=pytest.mark.slow)])  # 0: full path, fp32
def test_fused_processing_equals_the_processed_copy(dtype, topk_path_max):
    """Rows of a ProcessPlan (bias +-100, bans, penalties from a history) drawn by the kernel, on either path,
    equal the torch path drawing from process_rows_torch's fp32 copy (every pass processes as it loads)."""
    v = 700
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(5, v, generator=g) * 3).to(dtype).to(DEV)
    p = plan(v, [4, 1, 0, 3, 2], 3, g)
    proc = process_rows_torch(x, p).cpu()
    rows = torch.tensor([3, 0, 4, 1])  # plan rows (out is indexed by plan row)
    temp = torch.tensor([1.0, 0.7, 1.5, 2.0])
    top_k = torch.tensor([30, 5, 200, 60])
    top_p = torch.tensor([0.9, 1.0, 0.6, 1.0])
    min_p = torch.tensor([0.05, 0.0, 0.0, 0.02])
    for seed in range(3 if topk_path_max else 1):
        u = torch.rand(4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        want = sample_rows_torch(proc[rows], temp, top_k, top_p, u, min_p)
        got = _draw(
            x, rows, temp, top_k, top_p, u, min_p, 5, plan=p, chunk=256, topk_path_max=topk_path_max
        )  # fmt: skip
        assert got[rows].tolist() == want.tolist()
        assert got[2].item() == -7
        assert not torch.isinf(proc[rows].gather(1, want.unsqueeze(1))).any()  # never a banned token


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rows_with_fewer_finite_logits_than_k(dtype):
    """A row masked to 6 finite logits (a grammar's) under top-k 40: its -inf logits are not candidates (they
    weigh 0), so its 6 fit a 64-entry buffer; the draws equal the definition's and stay among the 6."""
    v = 500
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, v, generator=g) * 2
    allowed = torch.tensor([3, 77, 78, 200, 301, 499])
    x[1] = torch.where(torch.isin(torch.arange(v), allowed), x[1], float("-inf"))
    x = x.to(dtype)
    temp, top_k = torch.tensor([1.0, 1.5]), torch.tensor([40, 40])
    top_p, min_p = torch.tensor([0.9, 1.0]), torch.zeros(2)
    for seed in range(3):
        u = torch.rand(2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        got = _draw(x, torch.arange(2), temp, top_k, top_p, u, min_p, 2, chunk=128, candidates=64)
        assert got.tolist() == want.tolist() and got[1].item() in allowed.tolist()


def test_fp32_top_k_refined_inside_the_16_bit_bucket():
    """fp32 logits 100 apart by 2^-20 share their top 16 key bits: all 100 are candidates, and the draw's exact
    top-k (32-bit keys) keeps the 30 largest only, as the definition does; in any chunk of the row."""
    v = 400
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, v, generator=g) - 4
    for r in range(3):
        at = torch.randperm(v, generator=g)[:100]
        x[r, at] = 5.0 + torch.arange(100) * 2.0**-20
    temp, top_k = torch.full((3,), 0.01), torch.tensor([30, 30, 99])  # low T: the tokens differ in weight
    top_p, min_p = torch.tensor([1.0, 0.5, 1.0]), torch.zeros(3)
    for seed in range(3):
        u = torch.rand(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        got = _draw(x, torch.arange(3), temp, top_k, top_p, u, min_p, 3, chunk=128)
        assert got.tolist() == want.tolist()
        assert (x[:2].gather(1, got[:2].unsqueeze(1)) >= 5.0 + 70 * 2.0**-20).all()  # among the 30 largest
