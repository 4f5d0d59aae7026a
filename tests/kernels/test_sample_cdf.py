"""The sampling kernel's exact distribution (kernels/sample.py), not a frequency estimate.

The kernel turns the row's uniform u into a token by a monotone inverse CDF: the first kept token, in vocabulary
order, whose running kept weight exceeds u * total. So the u that give token t form an interval, and its length
is the probability the kernel gives t. Bisection on u finds the interval ends; their lengths must equal the
float64 softmax after temperature, top-k, top-p and min-p. Logits hold bf16-exact values (as float32 and as bfloat16),
so ties are exact: at the top-k and top-p cutoffs and at the top, and temperatures span 1e-4 to 1e4.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.sample import sample_rows
from tests.devices import KERNEL_DEVICE as DEV

V = 12
TIES = [0.5, 2.0, -1.0, 1.25, 0.75, 1.25, -0.5, 3.0, 1.25, 0.0, -2.0, 0.25]  # 1.25 three times: 3rd largest
NEAR_TOP = [3.0, -1.0, 2.984375, 0.5, 3.0, 2.96875, 1.0, -2.0, 0.0, 2.0, -0.5, 1.5]  # 3.0 twice, then 3 - 2^-6, ...
DELTA = 2.0**-20  # half-width of the bracket around the float64 CDF in which each interval end must lie
STEPS = 4  # bisection steps inside it: interval ends to 2^-24, lengths to 2^-23 (~1.2e-7)
TOL = 1e-6


def _random(seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, generator=g) * 2).bfloat16().float().tolist()


CASES = {  # name -> (logits, temperature, top_k, top_p, min_p)
    "plain": (_random(1), 1.0, V, 1.0, 0.0),
    "top-k cut inside a tie": (TIES, 0.9, 3, 1.0, 0.0),
    "top-p cut inside a tie": (TIES, 1.0, V, 0.7, 0.0),  # mass above the 1.25s is 0.61, above the 0.75 0.84
    "top-k and top-p": (_random(2), 0.8, 8, 0.9, 0.0),
    "small T, tied top": (NEAR_TOP, 2.0**-7, V, 1.0, 0.0),  # logit gaps of 2^-6 are weight ratios of e^-2
    "T 1e-4, tied top": (NEAR_TOP, 1e-4, V, 1.0, 0.0),  # two tokens of 1/2 each, the rest below 1e-60
    "T 1e4, top-p": (_random(3), 1e4, V, 0.45, 0.0),  # nearly uniform: the top-p cut falls between 5/12 and 6/12
    "min-p cut inside a tie": (TIES, 1.0, V, 1.0, 0.15),  # e^(1.25-3) = 0.17: the three 1.25s kept, 0.75 not
    "top-p and min-p": (_random(4), 0.9, V, 0.95, 0.08),  # top-p keeps more: min-p decides
    "min-p and top-p": (_random(5), 2.0, 10, 0.7, 0.02),  # top-p cuts deeper: it decides
}


def reference(
    logits: list[float], temp: float, top_k: int, top_p: float, min_p: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities [V] float64, margins): softmax(x / T) over the tokens kept by top-k (every logit >= the
    k-th largest), then top-p (every token whose kept mass strictly above its logit is < top_p), then min-p (every
    token whose weight exp(x / T - max) is >= min_p), renormalised. The margins |mass above - top_p| and
    |weight - min_p| (top-k-kept tokens) say how far each is from flipping in or out."""
    x = torch.tensor(logits, dtype=torch.float64)
    t = float(torch.tensor(temp, dtype=torch.float32))  # the temperature the kernel reads
    z = x / t
    kept = x >= x.sort(descending=True).values[top_k - 1]
    w = torch.where(kept, torch.exp(z - z.max()), 0.0)
    prob = w / w.sum()
    above = (prob.unsqueeze(0) * (x.unsqueeze(0) > x.unsqueeze(1))).sum(dim=1)  # [t]: mass of logits above x_t
    margins = torch.where(kept, (above - top_p).abs(), float("inf"))
    if min_p > 0:
        margins = torch.minimum(margins, torch.where(kept, (torch.exp(z - z.max()) - min_p).abs(), float("inf")))
    kept &= (above < top_p) & (torch.exp(z - z.max()) >= min_p)
    w = torch.where(kept, w, 0.0)
    return w / w.sum(), margins


def interval_ends(
    logits: torch.Tensor, temp: float, top_k: int, top_p: float, min_p: float, want: torch.Tensor
) -> list[float]:
    """Where the kernel's intervals end: b_t = inf{u : token(u) > t} for each token t of `want` > 1e-12 but the
    last (tokens below that mass, down to fp32 underflow, cannot be told apart from their neighbours).

    Each b_t is first bracketed within DELTA of the float64 CDF (the kernel's token at both ends checked), then
    bisected STEPS times. All draws share one run of the filter passes (sample_rows' `redraws`)."""
    tokens = (want > 1e-12).nonzero().flatten().tolist()[:-1]
    cdf = want.cumsum(0)
    lo = [max(0.0, float(cdf[t]) - DELTA) for t in tokens]
    hi = [min(1 - 2**-40, float(cdf[t]) + DELTA) for t in tokens]
    out = torch.full((1,), -1, dtype=torch.long, device=DEV)
    seen = set()

    def draw_at(u: float):
        yield torch.tensor([u], dtype=torch.float64, device=DEV), out
        seen.add(out.item())

    def probes():  # one kernel draw per yield; `out` holds its token when the generator resumes
        for j, t in enumerate(tokens):
            yield from draw_at(lo[j])
            assert out.item() <= t, f"token {t}'s interval ends before the float64 CDF {lo[j] + DELTA:.9f} - {DELTA}"
            yield from draw_at(hi[j])
            assert out.item() > t, f"token {t}'s interval ends after the float64 CDF {hi[j] - DELTA:.9f} + {DELTA}"
        for _ in range(STEPS):
            for j, t in enumerate(tokens):
                mid = (lo[j] + hi[j]) / 2
                yield from draw_at(mid)
                if out.item() > t:
                    hi[j] = mid
                else:
                    lo[j] = mid

    first = torch.full((1,), -1, dtype=torch.long, device=DEV)
    sample_rows(
        logits.to(DEV),
        torch.zeros(1, dtype=torch.long, device=DEV),
        torch.tensor([temp], dtype=torch.float32, device=DEV),
        torch.tensor([top_k], device=DEV),
        torch.tensor([top_p], dtype=torch.float32, device=DEV),
        torch.tensor([0.5], dtype=torch.float64, device=DEV),
        first,
        min_p=torch.tensor([min_p], dtype=torch.float32, device=DEV),
        redraws=probes(),
    )
    dropped = (seen | {first.item()}) - set((want > 0).nonzero().flatten().tolist())
    assert not dropped, f"the kernel drew {sorted(dropped)}, which the filters drop"
    return [(a + b) / 2 for a, b in zip(lo, hi)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_probabilities_equal_float64_softmax(case, dtype):
    logits, temp, top_k, top_p, min_p = CASES[case]
    want, margins = reference(logits, temp, top_k, top_p, min_p)
    if top_p < 1.0 or min_p > 0:  # fp32 and fp64 agree on the kept set only away from the cuts (ties sit exactly
        assert margins.min() > 1e-3, "the case puts a token within rounding of a cut"  # on one side)
    ends = interval_ends(torch.tensor([logits], dtype=dtype), temp, top_k, top_p, min_p, want)
    # interval lengths vs probabilities, each token with the negligible ones (< 1e-12) just before it
    got = torch.tensor([0.0, *ends, 1.0], dtype=torch.float64).diff()
    cdf = want.cumsum(0)
    tokens = (want > 1e-12).nonzero().flatten()
    expected = torch.cat(
        [torch.zeros(1, dtype=torch.float64), cdf[tokens[:-1]], torch.ones(1, dtype=torch.float64)]
    ).diff()
    err = (got - expected).abs().max().item()
    assert err <= TOL, (
        f"max |kernel - float64| = {err:.2e} over tokens {tokens.tolist()}: {got.tolist()} vs {expected.tolist()}"
    )
