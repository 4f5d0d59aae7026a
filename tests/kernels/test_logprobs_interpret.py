"""The fused logprob rows kernel (kernels/logprobs.py) against its definition: torch.log_softmax in fp32 gathered
at the targets, argmax, and the top k of a stable descending sort (ties: lowest index first), over random,
peaked, tied and partly -inf logits, vocabularies that are not a multiple of the tile, k 0..20, a strided view;
and the torch reference against the same definition. Runs on CUDA where there is one, else under the
interpreter (fp32 only: the kernel's input is fp32 by contract)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.logprobs import MAX_K, logprob_rows_torch, logprob_rows_triton
from tests.devices import KERNEL_DEVICE as DEV


def definition(x: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """The docstring's loop in torch ops: log_softmax, first argmax, stable sort descending."""
    lp = torch.log_softmax(x.double(), dim=-1)
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]  # ties: lowest index first
    cols = [lp.gather(1, targets[:, None]), x.argmax(dim=-1, keepdim=True).double()]
    if k:
        cols.append(torch.stack([order.double(), lp.gather(1, order)], dim=-1).flatten(1))
    return torch.cat(cols, dim=1).float()


def logits(kind: str, rows: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, v, generator=g) * 4
    if kind == "peaked":  # one token far above the rest (a confident model): exp underflows for all others
        x[torch.arange(rows), torch.randint(0, v, (rows,), generator=g)] = 90.0
    elif kind == "tied":  # few distinct values: top-k and argmax cross tiles with equal values everywhere
        x = torch.randint(0, 3, (rows, v), generator=g).float()
        x[0] = 0.0
        x[1, v - 2 :] = 7.0  # the maximum only at the end of the last (partial) tile
    elif kind == "neg_inf":  # banned tokens (-inf) and a whole first tile of them
        x[torch.rand(rows, v, generator=g) < 0.3] = float("-inf")
        x[0, : v // 2] = float("-inf")  # (whole tiles of it for every tile size used here)
    return x


def check(got: torch.Tensor, want: torch.Tensor, k: int) -> None:
    assert got.shape == want.shape == (want.shape[0], 2 + 2 * k)
    torch.testing.assert_close(got[:, 0], want[:, 0], atol=1e-5, rtol=1e-6)
    assert torch.equal(got[:, 1], want[:, 1])  # argmax
    assert torch.equal(got[:, 2::2], want[:, 2::2])  # top-k ids, in order
    torch.testing.assert_close(got[:, 3::2], want[:, 3::2], atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("kind", ["random", "peaked", "tied", "neg_inf"])
@pytest.mark.parametrize(("v", "block", "k"), [(300, 64, 5), (37, 16, 20), (1000, 128, 1), (129, 128, 0)])
def test_kernel_and_reference_equal_definition(kind, v, block, k):
    x = logits(kind, 6, v, seed=v + k)
    targets = torch.randint(0, v, (6,), generator=torch.Generator().manual_seed(k))
    if kind == "neg_inf":
        targets = x.argmax(-1)  # (a -inf target's logprob is -inf - lse: nothing to compare but the sign)
    want = definition(x, targets, k)
    check(logprob_rows_torch(x, targets, k), want, k)
    got = logprob_rows_triton(x.to(DEV), targets.to(DEV), k, block=block)
    check(got.cpu(), want, k)


def test_strided_rows_and_one_row():
    """A view whose row stride is not V (the rows of a wider buffer), and a single row (one merge program)."""
    wide = logits("random", 5, 200, seed=3)
    x = wide[:, :150]
    targets = torch.tensor([0, 149, 7, 75, 3])
    want = definition(x.contiguous(), targets, 4)
    check(logprob_rows_triton(x.to(DEV), targets.to(DEV), 4, block=32).cpu(), want, 4)
    one = logprob_rows_triton(x[2:3].to(DEV), targets[2:3].to(DEV), 4, block=32).cpu()
    check(one, want[2:3], 4)


def test_bad_arguments_are_refused():
    x = torch.randn(2, 30)
    t = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="k 21"):
        logprob_rows_torch(x, t, MAX_K + 1)
    with pytest.raises(ValueError, match="float32"):
        logprob_rows_triton(x.half(), t, 1)
    with pytest.raises(ValueError, match="targets"):
        logprob_rows_triton(x, t[:1], 1)
    assert logprob_rows_triton(x[:0], t[:0], 3).shape == (0, 8)


@pytest.mark.gpu
def test_llama3_vocabulary_on_cuda():
    """Real shapes on a GPU: 256 rows of a 128,256-token vocabulary in the default tiles, k 5 and 20."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = logits("random", 256, 128256, seed=1).cuda()
    x[:, 5000] = x[:, 4000] = 30.0  # a tie across tiles at the top
    targets = torch.randint(0, 128256, (256,), device="cuda")
    for k in (5, MAX_K):
        want = definition(x.cpu(), targets.cpu(), k)
        check(logprob_rows_triton(x, targets, k).cpu(), want, k)
        check(logprob_rows_torch(x, targets, k).cpu(), want, k)


def test_a_row_alone_gives_the_same_bits():
    """Batch invariance: a row's packed output does not depend on the rows launched with it."""
    x = logits("random", 5, 500, seed=9).to(DEV)
    targets = torch.tensor([4, 0, 499, 250, 3], device=DEV)
    every = logprob_rows_triton(x, targets, 6, block=128)
    for i in range(5):
        assert torch.equal(logprob_rows_triton(x[i : i + 1], targets[i : i + 1], 6, block=128)[0], every[i])
