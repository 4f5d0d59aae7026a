"""Sampler: greedy, top-k / top-p / min-p masks vs transformers' warpers, batch invariance, seeded determinism, and
sampled frequencies matching the target distribution; on both paths (`path`): the torch ops and the Triton
kernel (run by the interpreter without a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.request import Request
from multilora_cli.engine.sampler import Sampler, SamplingBatch, uniform
from multilora_cli.engine.sequence import Sequence, derive_seed
from multilora_cli.kernels.sample import kept_weights

V = 50
TRITON_RUNS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(
    params=[
        "torch",
        pytest.param(
            "triton",
            marks=pytest.mark.skipif(not TRITON_RUNS, reason="the Triton path needs CUDA or TRITON_INTERPRET=1"),
        ),
    ]
)
def path(request, monkeypatch):
    monkeypatch.setenv("MULTILORA_KERNELS", request.param)
    return request.param


def logits_rows(n, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g) * scale


def sample(logits, params, seeds, positions):
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel's real path on a GPU machine
    return Sampler()(logits.to(dev), SamplingBatch.build(params, seeds, positions, V, dev)).tolist()


def hf_probs(row, sp: SamplingParams):
    """transformers' sampling distribution: temperature, top-k, top-p, min-p warpers (its order), then softmax."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    x = row.unsqueeze(0).clone()
    x = TemperatureLogitsWarper(sp.temperature)(None, x)
    if sp.top_k:
        x = TopKLogitsWarper(sp.top_k)(None, x)
    if sp.top_p < 1.0:
        x = TopPLogitsWarper(sp.top_p)(None, x)
    if sp.min_p > 0.0:
        x = MinPLogitsWarper(sp.min_p)(None, x)
    return torch.softmax(x, dim=-1)[0]


def our_probs(row, sp: SamplingParams):
    t, k, p, m = (torch.tensor([v]) for v in (sp.temperature, sp.top_k or V, sp.top_p, sp.min_p))
    w = kept_weights(row.unsqueeze(0), t, k, p, m)[0]
    return w / w.sum()


def test_greedy_is_argmax_first_on_ties(path):
    x = logits_rows(4)
    x[2, 7] = x[2, 30] = x[2].max() + 1.0
    got = sample(x, [SamplingParams()] * 4, [1, 2, 3, 4], [0, 5, 9, 2])
    assert got == x.argmax(dim=-1).tolist() and got[2] == 7
    # top_k=1 with a temperature is greedy too
    assert sample(x, [SamplingParams(temperature=0.7, top_k=1)] * 4, [9] * 4, [0] * 4) == got


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0.8, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.7),
        SamplingParams(temperature=0.5, top_k=12, top_p=0.9),
        SamplingParams(temperature=1.0, top_p=0.05),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=0.7, min_p=0.3),
        SamplingParams(temperature=1.5, top_p=0.7, min_p=0.2),  # top-p cuts deeper than min-p on some rows
        SamplingParams(temperature=1.2, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=0.9, top_k=10, top_p=0.9, min_p=0.15),
    ],
)
def test_masks_match_transformers_warpers(sp):
    for i, row in enumerate(logits_rows(6, seed=1)):
        ref, ours = hf_probs(row, sp), our_probs(row, sp)
        assert torch.equal(ref > 0, ours > 0), i
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_batch_invariance_any_composition_and_order(path):
    x = logits_rows(7, seed=2)
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.9),
        SamplingParams(temperature=0.6, top_k=8),
        SamplingParams(temperature=1.2, top_p=0.8),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.95, min_p=0.1),
        SamplingParams(temperature=2.0, min_p=0.02),
    ]
    seeds = [11, 22, 33, 44, 55, 66, 77]
    positions = [0, 3, 1, 4, 1, 5, 9]
    alone = [sample(x[i : i + 1], [params[i]], [seeds[i]], [positions[i]])[0] for i in range(7)]
    assert sample(x, params, seeds, positions) == alone
    perm = [5, 2, 6, 0, 3, 1, 4]
    got = sample(x[perm], [params[i] for i in perm], [seeds[i] for i in perm], [positions[i] for i in perm])
    assert got == [alone[i] for i in perm]
    # duplicated next to other rows: still the same
    dup = sample(torch.cat([x[3:4], x]), [params[3], *params], [seeds[3], *seeds], [positions[3], *positions])
    assert dup == [alone[3], *alone]


def test_each_row_takes_the_kernel_path_of_its_own_top_k():
    """The sampled rows with a top_k below V and TOPK_PATH_MAX come first and are drawn by the kernel's top-k path,
    the others by its full path, whatever rows they sit with (the two paths sum the kept weights in other orders:
    a draw at a rounding boundary would otherwise depend on the batch)."""
    params = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6, top_k=8),
        SamplingParams(),
        SamplingParams(temperature=1.0, top_k=V),  # top_k = V: off, the full path
        SamplingParams(temperature=0.9, top_k=20, top_p=0.5),
    ]
    b = SamplingBatch.build(params, [1] * 5, [0] * 5, V)
    assert b.plain.rows.tolist() == [1, 4, 0, 3] and b.plain.num_topk == 2 and b.plain.max_top_k == 20
    alone = SamplingBatch.build(params[4:], [1], [0], V).plain
    assert alone.num_topk == 1 and alone.max_top_k == 20


def test_draws_depend_on_seed_and_position_only(path):
    x = logits_rows(1, seed=3, scale=0.3).expand(64, V).contiguous()  # flat: many tokens plausible
    sp = [SamplingParams(temperature=1.0)] * 64
    a = sample(x, sp, [5] * 64, list(range(64)))
    assert a == sample(x, sp, [5] * 64, list(range(64)))
    assert len(set(a)) > 10  # positions draw differently
    assert a != sample(x, sp, [6] * 64, list(range(64)))
    assert uniform(5, 3) == uniform(5, 3) and 0.0 <= uniform(5, 3) < 1.0


# 20000 interpreted programs take minutes: the Triton path of this test runs on a GPU only; the interpreter checks
# the kernel exactly instead (tests/kernels/test_sample_interpret.py, tests/kernels/test_sample_cdf.py)
@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=6),
        SamplingParams(temperature=1.5, top_p=0.6),
        SamplingParams(temperature=1.3, top_p=0.9, min_p=0.15),
    ],
)
@pytest.mark.parametrize("path", ["torch", pytest.param("triton", marks=pytest.mark.gpu)], indirect=True)
def test_sampled_frequencies_match_the_distribution(sp, path):
    n = 20000
    row = logits_rows(1, seed=4, scale=1.0)[0]
    target = hf_probs(row, sp)
    tokens = torch.tensor(sample(row.expand(n, V).contiguous(), [sp] * n, [1234] * n, list(range(n))))
    freq = torch.bincount(tokens, minlength=V).double() / n
    assert (freq[target == 0] == 0).all()  # masked tokens never come out
    sigma = (target.double() * (1 - target.double()) / n).sqrt()
    assert ((freq - target.double()).abs() <= 5 * sigma + 1e-4).all()
    # chi-square over tokens with enough mass, well under the 1e-4 tail for its degrees of freedom
    keep = target.double() * n >= 5
    chi2 = (((freq - target.double()) * n)[keep] ** 2 / (target.double() * n)[keep]).sum().item()
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5 + 10


def test_sequence_seed_from_request_or_engine():
    r1 = Request(key=7, id="a", sampling=SamplingParams(temperature=1.0, seed=99))
    r2 = Request(key=7, id="b", sampling=SamplingParams(temperature=1.0))
    r3 = Request(key=8, id="c", sampling=SamplingParams(temperature=1.0))
    assert Sequence.from_request(0, r1, [1]).seed == 99
    assert Sequence.from_request(1, r2, [1], engine_seed=3).seed == derive_seed(3, 7)
    assert derive_seed(3, 7) != derive_seed(3, 8) != derive_seed(4, 8)
    seqs = [Sequence.from_request(i, r, [1, 2]) for i, r in enumerate([r1, r2, r3])]
    b = SamplingBatch.for_seqs(seqs, V)
    assert b.num_rows == 3 and b.plain.rows.tolist() == [0, 1, 2] and b.plain.greedy_rows.tolist() == []
    assert b.plain.u[0].item() == uniform(99, 0) and b.processing is None


def test_rows_mismatch_is_an_error():
    with pytest.raises(ValueError):
        Sampler()(logits_rows(2), SamplingBatch.build([SamplingParams()], [0], [0], V))
