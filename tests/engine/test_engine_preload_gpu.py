"""Slot preloads on CUDA (issue 38; run through the device tool, skipped without a GPU): with a slot for every
adapter, the adapters read by the prefetch threads are loaded while steps run (`Scheduler.preload`), nothing is
evicted, and the tokens are HF + PEFT's, as with preloads off."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.builders import build_mixed
from tests.engine.test_engine_generate import _hf_greedy, _many_adapters, _prompts, _requests

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def check_preloads(tmp_path, device: str, n: int) -> None:
    """n adapters of 2 requests each (and 4 base ones) in n slots, preloads on then off: HF + PEFT's tokens both
    times, every adapter loaded once, nothing evicted; with preloads, some loads made ahead of admission."""
    base, adapters = build_mixed(tmp_path / "m", "llama")
    many = _many_adapters(tmp_path, adapters["all4rs"], n)
    plan = [f"ad{i % n}" for i in range(2 * n)] + [None] * 4
    prompts = _prompts(len(plan), seed=5)
    want = _hf_greedy(base, many, prompts, plan)
    cfg = EngineConfig(
        model=str(base), device=device, dtype="float32", max_loras=n, max_lora_rank=8, max_num_seqs=8, num_kv_blocks=512
    )
    for preloads in (2, 0):
        engine = Engine(cfg, many)
        engine.preloads_per_step = preloads  # (the engine preloads on CUDA only: CPU loads cannot overlap a step)
        try:
            got = [r.token_ids for r in engine.generate_all(_requests(prompts, plan))]
            st = engine.slots.stats()
        finally:
            engine.close()
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, f"preloads {preloads}: rows {bad} differ from HF + PEFT (a load raced a step?)"
        # every adapter loaded once
        assert st["evictions"] == 0 and st["loads"] == n, f"preloads {preloads}: slot stats {st}"
        if preloads:  # timing-dependent: a read must finish before its admission (0 before the fix: never)
            assert st["preloads"] > 0, f"no preload fired: slot stats {st}"
        else:
            assert st["preloads"] == 0, f"preloads fired while off: slot stats {st}"


def test_preloads_fire_with_a_slot_for_every_adapter_and_change_no_token(tmp_path):
    check_preloads(tmp_path, "cuda", 48)
