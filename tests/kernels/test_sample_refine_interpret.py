"""The top-k path's sub-bin refinement (kernels/sample_topk.py, MODE 7) against the torch definition: peaked rows
(N(0, 2) plus 20 tokens raised by 12-20, as a trained model's) whose 50th key lies in the bulk far below the top,
where the log2 distance bins hold far more keys than the wide buffer: the refined window fits and is drawn from,
with top-k alone and with top-p and min-p, beside rows that need no refinement and a row whose refined window
still overflows (ties at the k-th key: the whole-row fallback). `windows` mirrors the passes' bins in torch, so
each test first checks that its rows take the path it is about."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.sample import _ninf16, order_keys, sample_rows, sample_rows_torch
from tests.devices import KERNEL_DEVICE as DEV


def windows(x: torch.Tensor, k: int) -> tuple[int, int]:
    """Keys in row x's window of distance bins 0..j (MODE 9), and after MODE 7's sub-bins of bin j: (unrefined,
    refined) counts, from the module docstring's definitions."""
    k16 = order_keys(x.unsqueeze(0))[0] >> (16 if x.dtype == torch.float32 else 0)
    d = k16.max() - k16
    d = d[k16 > _ninf16(x.dtype)]
    b = (torch.log2((d + 2).double()).floor().long() - 1).clamp(max=14)
    cum = torch.bincount(b, minlength=15).cumsum(0)
    j = int(torch.nonzero(cum >= k)[0]) if bool((cum >= k).any()) else 14
    below = int((b < j).sum())
    sub = torch.bincount(((d[b == j] - ((2 << j) - 2)) >> max(j - 7, 0)).clamp(max=255), minlength=256)
    s = int(torch.nonzero(below + sub.cumsum(0) >= k)[0])
    return int(cum[j]), below + int(sub[: s + 1].sum())


def peaked(rows: int, v: int, g: torch.Generator) -> torch.Tensor:
    """N(0, 2) logits with 20 tokens a row raised by 12-20: [rows, v] fp32."""
    x = torch.randn(rows, v, generator=g) * 2
    for r in range(rows):
        at = torch.randperm(v, generator=g)[:20]
        x[r, at] += 12 + 8 * torch.rand(20, generator=g)
    return x


def _draw(x, temp, top_k, top_p, u, min_p, **kw):
    n = x.shape[0]
    out = torch.full((n,), -7, dtype=torch.long, device=DEV)
    args = [t.to(DEV) for t in (temp, top_k, top_p, u)]
    sample_rows(x.to(DEV), torch.arange(n, device=DEV), *args, out, min_p=min_p.to(DEV), **kw)
    return out.cpu()


def _u(n, seed):
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_peaked_rows_take_the_refined_window(dtype):
    """candidates=64: a wide buffer of 256, rows of 4096 in 8 chunks. Rows 0-2 peaked, top-k 50 alone, top-k 50
    with top-p 0.9, top-k 60 with top-p 0.5 and min-p 0.01: their bins 0..j hold ~1000 keys (overflow), their
    refined windows fit. Row 3 N(0, 3), top-k 40: no refinement. Row 4 peaked with 300 tokens tied at the 50th
    key's value: its refined window still overflows (one sub-bin holds the ties), the whole-row prefix and, past
    the 64 candidates, the serial draw."""
    v, wide = 4096, 256
    g = torch.Generator().manual_seed(29)
    x = peaked(5, v, g)
    x[3] = torch.randn(v, generator=g) * 3
    bulk = x[4].sort(descending=True).values[40]  # (below the 20 raised: in the bulk)
    x[4, torch.randperm(v, generator=g)[:300]] = bulk
    x = x.to(dtype)
    top_k = torch.tensor([50, 50, 60, 40, 50])
    for r, (over, fits) in enumerate([(True, True)] * 3 + [(False, True), (True, False)]):
        unrefined, refined = windows(x[r], int(top_k[r]))
        assert (unrefined > wide, refined <= wide) == (over, fits), (r, unrefined, refined)
    temp = torch.tensor([1.0, 0.8, 1.2, 1.0, 1.0])
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.95])
    min_p = torch.tensor([0.0, 0.0, 0.01, 0.0, 0.0])
    for seed in range(3):
        u = _u(5, seed)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        got = _draw(x, temp, top_k, top_p, u, min_p, chunk=512, candidates=64)
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_peaked_rows_at_the_serving_buffer(dtype):
    """The launch's own buffer (CANDIDATES: a wide buffer of 8192) on rows of 65536 in chunks of 8192: peaked
    rows overflow it at top-k 600 and 1000 (~17,000 keys in bins 0..j) and are drawn from the refined window
    (~k keys), top-k alone and with top-p 0.9."""
    v = 65536
    g = torch.Generator().manual_seed(7)
    x = peaked(2, v, g).to(dtype)
    top_k = torch.tensor([600, 1000])
    for r in range(2):
        unrefined, refined = windows(x[r], int(top_k[r]))
        assert unrefined > 8192 >= refined, (r, unrefined, refined)
    temp, top_p, min_p = torch.tensor([1.0, 0.7]), torch.tensor([1.0, 0.9]), torch.zeros(2)
    for seed in range(2):
        u = _u(2, seed)
        want = sample_rows_torch(x, temp, top_k, top_p, u, min_p)
        assert _draw(x, temp, top_k, top_p, u, min_p).tolist() == want.tolist()
