"""The engine on CUDA for Gemma 2, Gemma 3 and Phi-3 (LongRoPE too): mixed-adapter batches against HF + PEFT fp32
(run through the device tool; skipped without a GPU). fp32 with decode CUDA graphs: HF's greedy tokens exactly;
bf16: HF's first token wherever its top-1 margin is clear of bf16 rounding, and most tokens of every sequence."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed, hf_greedy_margins

pytestmark = pytest.mark.gpu

PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None, "mlp16", "all4rs"]
NEW = 8


# bf16 token agreement with HF fp32 ends at near-ties: a top-1 margin below TIE (about these tiny models' bf16 logit
# error, 0.03-0.05 against fp32) may flip either way, and every later token follows the flip. Measured on CPU bf16:
# every divergence of ours, and of HF's own bf16 model, sits at a margin of 0.002-0.019.
TIE = 0.05


@pytest.fixture(
    scope="module",
    params=[
        "gemma2",
        "gemma3",
        "phi3",
        "phi3-longrope",
    ],
)
def family(tmp_path_factory, request):
    """(base, adapters, prompts of 3-20 tokens: past the windows and both sides of LongRoPE's switch at 12,
    HF + PEFT fp32 greedy tokens, their top-1 margins)."""
    base, adapters = build_mixed(tmp_path_factory.mktemp(request.param.replace("-", "_")), request.param)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 256, (int(torch.randint(3, 21, (1,), generator=g)),), generator=g).tolist() for _ in PLAN
    ]
    tokens, margins = hf_greedy_margins(base, adapters, prompts, PLAN, NEW)
    return base, adapters, prompts, tokens, margins


def _run(base, adapters, prompts, dtype):
    engine = Engine(
        EngineConfig(
            model=str(base), device="cuda", dtype=dtype, max_loras=3, max_lora_rank=16, max_num_seqs=8, num_kv_blocks=64
        ),
        adapters,
    )
    assert engine.runner.graphs is not None
    reqs = [
        Request(
            key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(max_tokens=NEW, ignore_eos=True)
        )
        for i, (p, a) in enumerate(zip(prompts, PLAN))
    ]
    got = engine.generate_all(reqs)
    engine.close()
    assert [r.error for r in got] == [None] * len(PLAN)
    return [r.token_ids for r in got]


def test_fp32_cuda_tokens_equal_hf_peft(family):
    base, adapters, prompts, want, _ = family
    assert _run(base, adapters, prompts, "float32") == want


def test_bf16_cuda_close_to_hf_fp32(family, request):
    """Each sequence equals HF fp32 up to its first near-tie (margin < TIE), and enough tokens are compared for the
    test to bite; most tokens agree overall, except for the tiny LongRoPE model, whose margins sit near ties
    throughout (HF's own bf16 model agrees on 78% of its tokens there: CPU measurement)."""
    base, adapters, prompts, want, margins = family
    got = _run(base, adapters, prompts, "bfloat16")
    compared = 0
    for g, w, m in zip(got, want, margins):
        n = next((s for s, v in enumerate(m) if v < TIE), NEW)
        assert g[:n] == w[:n]
        compared += n
    assert compared >= NEW
    if request.node.callspec.params["family"] != "phi3-longrope":
        assert sum(a == b for g, w in zip(got, want) for a, b in zip(g, w)) >= 0.75 * NEW * len(PLAN)
