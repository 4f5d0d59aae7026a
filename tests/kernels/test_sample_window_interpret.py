"""The top-k path's window search (kernels/sample_topk.py: chunk max key16, distance counts, the window's keys
buffered, the prefix found on the buffer) against the torch definition: rows whose window overflows the wide
buffer (the prefix then comes from the radix levels over the whole row), windows that hold many more keys than
the candidates, ties straddling a distance bin, -inf rows with fewer finite logits than k, top-p cutting among
tied keys, every field mixed per row on processed rows, in fp32, fp16 and bf16."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.penalties import process_rows_torch
from multilora_cli.kernels.sample import order_keys, sample_rows, sample_rows_torch
from tests.devices import KERNEL_DEVICE as DEV
from tests.kernels.test_penalties_interpret import plan


def _draw(x, rows, temp, top_k, top_p, u, min_p, n_out, **kw):
    out = torch.full((n_out,), -7, dtype=torch.long, device=DEV)
    args = [t.to(DEV) for t in (temp, top_k, top_p, u)]
    sample_rows(x.to(DEV), rows.to(DEV), *args, out, min_p=min_p.to(DEV), **kw)
    return out.cpu()


def _u(n, seed):
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_window_overflow_takes_the_row_prefix(dtype):
    """candidates=16: a wide buffer of 64. Row 0: the top logit, 4 just below it and 100 tied a little lower, all
    within the first distance bins: its window (105 keys) overflows the buffer, so one program finds the prefix
    over the whole row; its 5 candidates still fit and are drawn from. Row 1: the same shape with 40 ties (45
    keys: the buffer path). Row 2: N(0, 2) noise (a small window)."""
    v = 400
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, v, generator=g) * 2 - 6
    for r, ties in ((0, 100), (1, 40)):
        at = torch.randperm(v, generator=g)[: 5 + ties]
        x[r, at[0]] = 10.0
        x[r, at[1:5]] = 9.5
        x[r, at[5:]] = 9.25
    x = x.to(dtype)
    key16 = order_keys(x[0]) >> (16 if dtype == torch.float32 else 0)

    def distance_bin(value):  # floor(log2(max key16 - key16 + 2)) - 1
        return int(torch.log2((key16.max() - key16[x[0] == value].max() + 2).double()).floor()) - 1

    assert distance_bin(9.25) <= distance_bin(9.5)  # the ties sit in the k-th key's bin: inside the window
    temp = torch.tensor([0.5, 0.5, 1.0])
    top_k, top_p, min_p = torch.tensor([5, 5, 12]), torch.tensor([0.9, 1.0, 0.8]), torch.zeros(3)
    for seed in range(3):
        u = _u(3, seed)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        got = _draw(x, torch.arange(3), temp, top_k, top_p, u, min_p, 3, chunk=128, candidates=16)
        assert got.tolist() == want.tolist()
        assert x[0, got[0]].float() >= 9.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_varied_rows_against_the_definition(dtype):
    """Eight rows in chunks of 64 (a window spread over 8 chunks): ties at the k-th key, k above the finite
    logits (-inf elsewhere), a k-th key far below the top (a wide window: bin 12 and up), top-p cutting among
    ties, min-p, a row of equal logits (every key in bin 0: the serial fallback), k = 1."""
    v = 512
    g = torch.Generator().manual_seed(21)
    x = torch.randn(8, v, generator=g) * 3
    x[0, 10:40] = x[0].max() - 0.5  # 30 ties near the top, k = 20 cuts among them
    x[1] = torch.where(torch.rand(v, generator=g) < 0.05, x[1], float("-inf"))  # ~25 finite, k = 60
    x[2] = torch.randn(v, generator=g) * 0.01 - 30.0
    x[2, :3] = 40.0  # the top 3 far above the rest: the 10th key lies far below the top
    x[3, 100:180] = 4.0  # 80 ties: top-p 0.3 keeps all of them or none (its cut falls among them)
    x[3, :5] = 6.0
    x[5] = 1.5  # every logit equal: 512 candidates > the buffer (serial)
    x = x.to(dtype)
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    temp = torch.tensor([1.0, 0.8, 1.0, 1.0, 0.7, 1.0, 1.2, 1.0])
    top_k = torch.tensor([20, 60, 10, 90, 50, 7, 1, 300])
    top_p = torch.tensor([1.0, 0.9, 0.95, 0.3, 0.9, 1.0, 1.0, 0.8])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.02])
    for seed in range(3):
        u = _u(8, seed)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        got = _draw(x, rows, temp, top_k, top_p, u, min_p, 8, chunk=64, candidates=256)
        assert got.tolist() == want.tolist()
        if seed == 0:  # the distance counts by Triton's histogram instead of packed registers: the same
            hist = _draw(x, rows, temp, top_k, top_p, u, min_p, 8, chunk=64, candidates=256, packed_counts=False)
            assert hist.tolist() == want.tolist()
        assert not torch.isinf(x[1, got[1]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_processed_rows_mixed_fields(dtype):
    """Processed rows (bias +-100, bans, penalties) on the window search (32-bit keys: the buffered fp32
    processed logits' top 16 bits), each row with its own top-k / top-p / min-p, one with ties after processing,
    against the torch path on process_rows_torch's copy."""
    v = 640
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, v, generator=g) * 2
    x[2, 200:260] = 5.0  # ties (the penalties move those counted)
    x = x.to(dtype).to(DEV)
    p = plan(v, [4, 1, 0, 3, 2], 3, g)
    proc = process_rows_torch(x, p).cpu()
    rows = torch.tensor([0, 1, 2, 3, 4])
    temp = torch.tensor([1.0, 0.7, 1.5, 2.0, 0.9])
    top_k = torch.tensor([30, 5, 45, 200, 1])
    top_p = torch.tensor([0.9, 1.0, 0.6, 1.0, 0.5])
    min_p = torch.tensor([0.05, 0.0, 0.0, 0.02, 0.0])
    for seed in range(3):
        u = _u(5, seed)
        want = sample_rows_torch(proc[rows], temp, top_k, top_p, u, min_p)
        got = _draw(x, rows, temp, top_k, top_p, u, min_p, 5, plan=p, chunk=128, candidates=128)
        assert got[rows].tolist() == want.tolist()
