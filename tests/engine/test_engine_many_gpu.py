"""Many adapters on CUDA (issue 38; run through the device tool, skipped without a GPU): 40 adapters of one
request each, in a pool of 40 slots and in 6, with decode CUDA graphs and the pinned arena: the same fp32 tokens
as HF + PEFT, and one scatter plan serves every slot (per adapter layout, not per slot)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.builders import build_mixed
from tests.engine.test_engine_generate import _hf_greedy, _many_adapters, _prompts, _requests

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_single_request_adapters_many_slots_and_few(tmp_path):
    base, adapters = build_mixed(tmp_path / "m", "llama")
    many = _many_adapters(tmp_path, adapters["all4rs"], 40)
    plan = [f"ad{i}" for i in range(40)] + [None] * 4
    prompts = _prompts(len(plan), seed=11)
    want = _hf_greedy(base, many, prompts, plan)
    for slots in (40, 6):
        cfg = EngineConfig(
            model=str(base),
            device="cuda",
            dtype="float32",
            max_loras=slots,
            max_lora_rank=8,
            max_num_seqs=16,
            num_kv_blocks=512,
        )
        engine = Engine(cfg, many)
        engine.runner.step_log = []
        got = [r.token_ids for r in engine.generate_all(_requests(prompts, plan))]
        assert got == want, slots
        assert max(s.adapters for s in engine.runner.step_log) == min(slots, 16)
        assert len(engine.runner.adapters.writer._plans) == 1  # one layout: one plan for all the slots it used
        engine.close()
