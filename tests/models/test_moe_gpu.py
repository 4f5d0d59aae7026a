"""MoE bases with expert + attention LoRA on CUDA fp32 (the fused MoE Triton kernels, eager and in CUDA graphs) equal
HF + PEFT fp32 on the CPU (run through the device tool; skipped without a GPU)."""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.models.moe_builders import MOE_ARCHS, build_module_adapter, build_moe_base
from tests.models.test_moe import _adapters, _check, _hf, _prompts, _requests

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_mixed_batch_on_cuda_matches_hf_peft_cpu(tmp_path, arch, eager):
    base = build_moe_base(tmp_path / "base", arch)
    adapters = _adapters(tmp_path, base)
    adapters["module"] = build_module_adapter(base, tmp_path / "module", arch)
    plan = ["experts", None, "attn", "both", "module", "experts", None, "both", "module", "attn"]
    prompts = _prompts(len(plan))
    # a fixed KV size: sized from free memory, the engine would take 90% of the card from the tests after it
    cfg = EngineConfig(
        model=str(base),
        device="cuda",
        dtype="float32",
        max_loras=2,
        max_lora_rank=8,
        num_kv_blocks=64,
        enforce_eager=eager,
    )
    engine = Engine(cfg, adapters)
    try:
        got = engine.generate_all(_requests(prompts, plan))
    finally:
        engine.close()
    _check(got, _hf(base, adapters, prompts, plan))
