"""On CUDA an adapter's NaN / Inf is found by its slot load's device check (engine/slot_writer.py), not by a host
pass: its lines fail with the error a host check gives (naming the tensor), rows of other adapters in the same
steps are what they are without it (its ranks were held at 0: no NaN reached a shared tile), and a later line of it
is refused without another load. Dense (Llama) and MoE (Qwen3-MoE, a NaN in the expert LoRA), graphs on and off
(run through the device tool; skipped without a GPU)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.errors import AdapterError
from tests.builders import build_mixed

pytestmark = pytest.mark.gpu


def _poison(src, dst, part: str, dtype=torch.float32):
    """A copy of adapter `src` with a NaN in its last tensor named with `part`, stored in `dtype` (the engine's:
    a read in another dtype converts on the host and is checked there)."""
    shutil.copytree(src, dst)
    f = dst / "adapter_model.safetensors"
    sd = {k: v.to(dtype) for k, v in load_file(f).items()}
    key = sorted(k for k in sd if part in k)[-1]
    sd[key].view(-1)[sd[key].numel() // 2] = float("nan")
    save_file(sd, f)
    return dst


def _requests(prompts, plan, new=6):
    sp = SamplingParams(max_tokens=new, ignore_eos=True)
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=sp)
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def _prompts(n):
    g = torch.Generator().manual_seed(5)
    return [
        torch.randint(3, 200, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _check(base, adapters, bad: str, plan, eager: bool, dtype: str, cfg=None):
    prompts = _prompts(len(plan))
    kw = dict(model=str(base), device="cuda", dtype=dtype, max_loras=3, max_lora_rank=16, max_num_seqs=16,
              num_kv_blocks=128, enforce_eager=eager)  # fmt: skip
    kw.update(cfg or {})
    engine = Engine(EngineConfig(**kw), adapters)
    try:
        assert engine._device_checks
        with pytest.raises(AdapterError, match="NaN or Inf") as e:
            load_adapter(adapters[bad], bad, engine.model_config)
        want_error = e.value.message
        got = engine.generate_all(_requests(prompts, plan))
        writer = engine.runner.adapters.writer
        assert writer.device_checks >= 1
        clean_plan = [a if a != bad else None for a in plan]
        clean = engine.generate_all(_requests(prompts, clean_plan))
        # a later line of the broken adapter: refused at admission, no second load
        loads = engine.slots.adapter_loads.get(bad, 0)
        again = engine.generate_all(_requests(prompts[:1], [bad]))
        assert engine.slots.adapter_loads.get(bad, 0) == loads
    finally:
        engine.close()
    for r, a, c in zip(got, plan, clean):
        if a == bad:
            assert r.error is not None and r.error.message == want_error, r.error
        else:
            assert r.error is None and r.token_ids == c.token_ids  # untouched by the broken rows beside them
    assert again[0].error is not None and again[0].error.message == want_error


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dense_nan_found_on_the_device(tmp_path, eager, dtype):
    base, adapters = build_mixed(tmp_path, "llama")
    adapters["nanad"] = _poison(adapters["qv8"], tmp_path / "nanad", "lora_B", getattr(torch, dtype))
    plan = ["nanad", "qv8", None, "nanad", "all4rs", "mlp16", "nanad", "qv8", None, "mlp16"]
    _check(base, adapters, "nanad", plan, eager, dtype)


@pytest.mark.parametrize("eager", [False, True])
def test_moe_expert_nan_found_on_the_device(tmp_path, eager):
    from tests.models.moe_builders import build_moe_base
    from tests.models.test_moe import _adapters

    base = build_moe_base(tmp_path / "base", "qwen3_moe")
    adapters = _adapters(tmp_path, base)
    adapters["nanex"] = _poison(adapters["experts"], tmp_path / "nanex", "experts")
    plan = ["nanex", "experts", None, "attn", "nanex", "both", "experts", "nanex"]
    _check(base, adapters, "nanex", plan, eager, "float32", cfg=dict(max_lora_rank=8))
