"""The sort-free sampling kernel (kernels/sample.py) against its torch definition, and that definition against
transformers' warpers: fp32 / fp16 / bf16 logits (32- and 16-bit keys), odd vocab sizes, one chunk per row and
rows cut into several chunks (the draw falling in any of them), ties at the top-k and top-p boundaries, rows
picked out of a larger batch, and the ids written only at those rows."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.sample import kept_weights, order_keys, sample_rows, sample_rows_torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _params(r: int, v: int, g: torch.Generator):
    temp = torch.rand(r, generator=g) * 1.5 + 0.3
    top_k = torch.where(torch.rand(r, generator=g) < 0.5, torch.randint(1, max(2, v // 4), (r,), generator=g), v)
    top_p = torch.where(torch.rand(r, generator=g) < 0.6, torch.rand(r, generator=g) * 0.95 + 0.03, torch.ones(r))
    u = torch.rand(r, generator=g, dtype=torch.float64)
    min_p = torch.where(torch.rand(r, generator=g) < 0.5, torch.rand(r, generator=g) * 0.4, torch.zeros(r))
    return temp, top_k, top_p, u, min_p


@pytest.mark.slow  # the interpreter's sweep: its filter passes run tens of ms per program
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "v,chunk", [(1, None), (7, None), (50, None), (50, 16), (1000, None), (2053, None), (700, 128)]
)
def test_kernel_equals_torch_definition(dtype, v, chunk):
    g = torch.Generator().manual_seed(v)
    n = 9
    x = (torch.randn(n, v, generator=g) * 3).to(dtype)
    x[2, : v // 2] = x[2, 0]  # a row of many equal logits: ties everywhere
    rows = torch.tensor([7, 0, 2, 5, 3, 8])  # out of order, some rows not sampled
    temp, top_k, top_p, u, min_p = _params(len(rows), v, g)
    top_k[2] = max(1, v // 3)  # the k-th key sits inside the run of ties
    top_p[2] = 0.5
    out = torch.full((n,), -7, dtype=torch.long, device=DEV)
    args = (x.to(DEV), rows.to(DEV), *(t.to(DEV) for t in (temp, top_k, top_p, u)), out)
    sample_rows(*args, min_p=min_p.to(DEV), chunk=chunk)
    out = out.cpu()
    want = sample_rows_torch(x[rows], temp, top_k, top_p, u, min_p)
    assert out[rows].tolist() == want.tolist()
    assert out[[1, 4, 6]].tolist() == [-7, -7, -7]  # rows not asked for are untouched
    kept = kept_weights(x[rows], temp, top_k, top_p, min_p) > 0
    assert kept.gather(1, want.unsqueeze(1)).all()  # every pick is a kept token


def test_order_keys_follow_the_floats():
    vals = torch.tensor([-float("inf"), -3.5, -1.0, -1e-30, 0.0, 1e-30, 0.25, 2.0, 7e4, float("inf")])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        k = order_keys(vals.to(dtype).unsqueeze(0))[0]
        assert (k[1:] >= k[:-1]).all() and (k >= 0).all(), dtype


def test_ties_at_the_boundaries_are_kept():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0, -1.0]])
    one = torch.ones(1)
    w = kept_weights(x, one, torch.tensor([2]), one)  # k-th (2nd) largest value 2.0 is tied three times
    assert (w[0] > 0).tolist() == [True, False, True, True, True, False, False]
    # top-p: the tokens above 2.0 hold less than 0.6 of the mass, so every 2.0 is kept, nothing below
    w = kept_weights(x, one, torch.tensor([7]), torch.tensor([0.6]))
    assert (w[0] > 0).tolist() == [True, False, True, True, True, False, False]
    out = torch.full((1,), -1, dtype=torch.long, device=DEV)
    picks = set()
    for u in (0.0, 0.3, 0.6, 0.9, 0.999):
        sample_rows(
            x.to(DEV),
            torch.zeros(1, dtype=torch.long, device=DEV),
            one.to(DEV),
            torch.tensor([7], device=DEV),
            torch.tensor([0.6], device=DEV),
            torch.tensor([u], dtype=torch.float64, device=DEV),
            out,
        )
        picks.add(out.item())
    assert picks <= {0, 2, 3, 4} and len(picks) > 1


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (50, 0.7), (12, 0.9), (50, 0.05), (3, 0.5)])
def test_definition_matches_transformers_warpers(top_k, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(top_k)
    x = torch.randn(6, 50, generator=g) * 2
    ref = TemperatureLogitsWarper(0.8)(None, x.clone())
    ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(None, ref)
    ref = torch.softmax(ref, dim=-1)
    w = kept_weights(x, torch.full((6,), 0.8), torch.full((6,), top_k), torch.full((6,), top_p))
    ours = w / w.sum(dim=-1, keepdim=True)
    assert torch.equal(ref > 0, ours > 0)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("top_k,top_p", [(30, 1.0), (50, 0.8), (20, 0.6)])
def test_draws_land_in_every_chunk(top_k, top_p):
    """One row cut into 4 chunks of 16 logits, u swept over [0, 1): the chunk holding the draw is found from the
    chunks' kept weights, and the pick equals the definition's for every u, up to u just below 1."""
    g = torch.Generator().manual_seed(top_k)
    n = 12
    # bf16 (4 radix levels); flat, so kept tokens sit in every chunk
    x = (torch.randn(1, 50, generator=g) * 0.5).expand(n, 50).contiguous().bfloat16()
    u = torch.cat([torch.linspace(0.0, 0.97, n - 1, dtype=torch.float64), torch.tensor([1 - 2**-40]).double()])
    temp, k, p = torch.ones(n), torch.full((n,), top_k), torch.full((n,), top_p)
    rows = torch.arange(n)
    out = torch.full((n,), -1, dtype=torch.long, device=DEV)
    sample_rows(x.to(DEV), rows.to(DEV), temp.to(DEV), k.to(DEV), p.to(DEV), u.to(DEV), out, chunk=16)
    want = sample_rows_torch(x, temp, k, p, u)
    assert out.cpu().tolist() == want.tolist()
    assert len({t // 16 for t in want.tolist()}) >= 3  # the draws really spread over the chunks
    assert want[-1].item() == int((kept_weights(x[:1], temp[:1], k[:1], p[:1])[0] > 0).nonzero().max())
