"""Where ONE LM-head GEMM may serve both the sampler and the logprobs of a step: a check, once when the runner
starts, that the model-dtype GEMM equals the fp32-output GEMM rounded to the model dtype, bit for bit.

A step whose rows ask for logprobs needs the fp32 logits of those rows (a bf16 logit is too coarse for a
log-likelihood) and the model-dtype logits of every row for the sampler. Those must be the bits the sampler gets
when no row asks, or a greedy near-tie would make a row's text depend on its neighbours' requests. A bf16-output
cuBLAS GEMM rounds its fp32 accumulator once, so it equals the fp32-output GEMM rounded to bf16 (round to nearest
even: torch's `.to`) exactly when cuBLAS runs kernels of the same accumulation order (tile shape, split-K) for
both output dtypes; it picks them per M and output dtype by heuristics and promises nothing across shapes, GPUs
or versions (measured on an H200 for the Llama-3-8B head: equal at every M tried, 1-256). So the runner asks:

    for m in 1 .. max_rows:                    # h: [max_rows, H] random, model dtype; W: the real lm_head
        ok[m] = bits(model_gemm(h[:m])) == bits(fp32_gemm(h[:m]).to(model dtype))   # every element

and a step of N sampled rows with some row asking runs one fp32-output GEMM (Model.compute_logits_pair) only if
ok[N]; else the model-dtype GEMM for every row plus an fp32-output GEMM for the rows that ask. Every M a step can
have (<= max_rows) is checked, not a sample: cuBLAS's heuristics switch kernels at M thresholds of their own.
lm_head adapters and Gemma 2's soft-cap run after the rounding on the sampler's logits exactly as without
logprobs, so only the base GEMM needs the check. An fp32 model always passes (both are one and the same GEMM);
off CUDA a model-dtype model never does (fp32 math there is not the model-dtype GEMM rounded).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

Gemm = Callable[[torch.Tensor], torch.Tensor]  # hidden [m, H] -> logits [m, V]


@dataclass(slots=True)
class HeadGemms:
    """The check's outcome: ok[m] (m = 0 .. max_rows) says a step of m sampled rows runs one LM-head GEMM when
    some row asks for logprobs; `why` in words; `seconds` the check took. The run's stats show `stats()`."""

    ok: np.ndarray  # [max_rows + 1] bool (ok[0] False)
    why: str
    seconds: float = 0.0
    mismatched: list[int] = field(default_factory=list)  # the row counts whose bits differed (the check ran)

    @classmethod
    def every(cls, max_rows: int, why: str) -> HeadGemms:
        ok = np.ones(max_rows + 1, dtype=bool)
        ok[0] = False
        return cls(ok, why)

    @classmethod
    def none(cls, why: str) -> HeadGemms:
        return cls(np.zeros(1, dtype=bool), why)

    def one_gemm(self, rows: int) -> bool:
        return rows < self.ok.shape[0] and bool(self.ok[rows])

    def stats(self) -> dict:
        """{"path": "one_gemm" | "two_gemms" | "mixed", "one_gemm_rows": how many row counts (1 .. max_rows) take
        one GEMM, "max_rows", "mismatched": up to 16 row counts whose bits differed, "why", "check_s"}."""
        n = int(self.ok.sum())
        top = self.ok.shape[0] - 1
        path = "two_gemms" if n == 0 else "one_gemm" if n == top else "mixed"
        return {
            "path": path,
            "one_gemm_rows": n,
            "max_rows": top,
            "mismatched": self.mismatched[:16],
            "why": self.why,
            "check_s": round(self.seconds, 3),
        }


@torch.inference_mode()
def check_rounding(
    model_gemm: Gemm, fp32_gemm: Gemm, max_rows: int, hidden_size: int, dtype: torch.dtype, device, seed: int = 0
) -> np.ndarray:
    """ok [max_rows + 1] bool (ok[0] False): ok[m] iff model_gemm(h[:m]) has the bits of fp32_gemm(h[:m]) rounded to its dtype,
    for h [max_rows, hidden_size] standard normal in `dtype` (final-normed hidden states are of that scale).
    The comparisons stay on the device; one read at the end."""
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(max_rows, hidden_size, generator=g, device=device, dtype=torch.float32).to(dtype)
    same = torch.zeros(max_rows + 1, dtype=torch.bool, device=device)
    for m in range(1, max_rows + 1):
        a = model_gemm(h[:m])  # [m, V] model dtype
        b = fp32_gemm(h[:m]).to(a.dtype)  # [m, V] fp32 -> rounded to nearest even
        same[m] = (a.view(torch.uint8) == b.view(torch.uint8)).all()  # bytes: -0 vs 0 and NaNs told apart
    return same.cpu().numpy()


def head_gemms(model, max_rows: int) -> HeadGemms:
    """The runner's choice for `model` (models/llama.py) whose steps sample at most `max_rows` rows under the one
    GEMM's memory bound: see the module docstring."""
    w = model.lm_head.weight
    if max_rows < 1:
        return HeadGemms.none("the vocabulary is too large for one fp32 logits chunk")
    if w.dtype == torch.float32:
        return HeadGemms.every(max_rows, "fp32 model: the sampler's GEMM is the fp32 one")
    if w.device.type != "cuda":
        return HeadGemms.none(f"{w.dtype} off CUDA: fp32 math there is not the model-dtype GEMM rounded")
    t0 = time.perf_counter()
    ok = check_rounding(model.lm_head, model.head_product_fp32, max_rows, w.shape[1], w.dtype, w.device)
    bad = [m for m in range(1, max_rows + 1) if not ok[m]]
    why = "checked: equal bits at every row count" if not bad else f"checked: bits differ at {len(bad)} row counts"
    return HeadGemms(ok, why, time.perf_counter() - t0, bad)
