"""The engine on CUDA with a model whose every layer slides (Mistral, window 16, blocks of 8): the Triton prefill
and decode kernels and the decode CUDA graphs run over block tables whose entries behind the window are dropped
(-1), against HF + PEFT fp32 (run through the device tool; skipped without a GPU). fp32: HF's greedy tokens
exactly, with a roomy cache and with one smaller than a sequence's whole KV (preemption, recompute); bf16: HF's
tokens up to each row's first near-tie, most tokens overall."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.block_manager import cdiv
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_adapter, build_base, build_tokenizer, hf_greedy_margins, mixed_adapters
from tests.engine.test_engine_families_gpu import TIE
from tests.engine.test_engine_window import _spy_held

pytestmark = pytest.mark.gpu

W, BS, BUDGET, NEW = 16, 8, 32, 40
PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None, "mlp16", "all4rs"]


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """(base, adapters, prompts of 40-70 tokens, HF + PEFT fp32 greedy tokens, their top-1 margins)."""
    root = tmp_path_factory.mktemp("window_gpu")
    base = build_base(root / "base", "mistral", sliding_window=W)
    build_tokenizer(base)
    adapters = {n: build_adapter(base, root / n, **kw) for n, kw in mixed_adapters("mistral").items()}
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 256, (int(torch.randint(40, 71, (1,), generator=g)),), generator=g).tolist() for _ in PLAN
    ]
    tokens, margins = hf_greedy_margins(base, adapters, prompts, PLAN, NEW)
    return base, adapters, prompts, tokens, margins


def _run(base, adapters, prompts, dtype, **kw):
    cfg = dict(model=str(base), device="cuda", dtype=dtype, max_loras=3, max_lora_rank=16, max_num_seqs=8)
    engine = Engine(EngineConfig(**{**cfg, "block_size": BS, "max_num_batched_tokens": BUDGET, **kw}), adapters)
    assert engine.runner.graphs is not None and engine.block_manager.window == W
    seen = _spy_held(engine)
    reqs = [
        Request(
            key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(max_tokens=NEW, ignore_eos=True)
        )
        for i, (p, a) in enumerate(zip(prompts, PLAN))
    ]
    got = engine.generate_all(reqs)
    preemptions = engine.scheduler.num_preemptions
    engine.close()
    assert [r.error for r in got] == [None] * len(PLAN)
    assert max(h for h, n in seen if n == 1) <= cdiv(W, BS) + 1  # decoding: the window's blocks only
    return [r.token_ids for r in got], preemptions


def test_fp32_cuda_tokens_equal_hf_peft(windowed):
    base, adapters, prompts, want, _ = windowed
    assert _run(base, adapters, prompts, "float32", num_kv_blocks=256)[0] == want


def test_fp32_cuda_preemption_in_a_small_cache(windowed):
    """14 blocks of 8 (112 tokens) for 8 rows of 80-110 tokens: each holds at most 7 blocks at once."""
    base, adapters, prompts, want, _ = windowed
    # reads on the step loop's thread: which rows run together (so whether the cache overflows) must not depend
    # on read timing
    got, preemptions = _run(base, adapters, prompts, "float32", num_kv_blocks=14, prefetch_threads=0)
    assert got == want and preemptions > 0


def test_bf16_cuda_close_to_hf_fp32(windowed):
    base, adapters, prompts, want, margins = windowed
    got, _ = _run(base, adapters, prompts, "bfloat16", num_kv_blocks=256)
    compared = 0
    for g, w, m in zip(got, want, margins):
        n = next((s for s, v in enumerate(m) if v < TIE), NEW)
        assert g[:n] == w[:n]
        compared += n
    # no agreement share after the first near-tie: one flipped token changes the rest of its row, so that share
    # measures the tiny model's margins, not the engine (70% on an H200); the fp32 tests check tokens exactly
    assert compared >= NEW
