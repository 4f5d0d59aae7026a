"""Tiny MoE bases (Mixtral, Qwen2-MoE, Qwen3-MoE) written by transformers, and expert-LoRA adapters in both layouts:
PEFT `target_parameters` on the 3D expert parameters, and per-expert module LoRA written by hand (older stacks)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.builders import TINY, build_adapter, build_tokenizer, hf_model

MOE_ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe"]
E, TOP_K, I_E = 6, 2, 48


def tiny_moe_config(arch: str, **overrides):
    import transformers as tf

    kw = dict(TINY)
    if arch == "mixtral":
        return tf.MixtralConfig(
            **{**kw, "num_local_experts": E, "num_experts_per_tok": TOP_K, "intermediate_size": I_E, **overrides}
        )
    moe = dict(num_experts=E, num_experts_per_tok=TOP_K, moe_intermediate_size=I_E, norm_topk_prob=False)
    if arch == "qwen2_moe":  # layer 1 dense (mlp_only_layers), a shared expert with its sigmoid gate
        return tf.Qwen2MoeConfig(
            **{**kw, **moe, "shared_expert_intermediate_size": 40, "mlp_only_layers": [1], **overrides}
        )
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**{**kw, **moe, "norm_topk_prob": True, "head_dim": 32, **overrides})
    raise ValueError(arch)


def build_moe_base(path: Path, arch: str, seed: int = 0, **overrides) -> Path:
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(tiny_moe_config(arch, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer(path)
    return Path(path)


def expert_params(arch: str) -> list[str]:
    return ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def build_param_adapter(base: Path, out: Path, *, targets=(), params=None, r=4, alpha=8, seed=1, **kw) -> Path:
    """A real PEFT adapter: LoRA on `targets` modules and on the 3D expert parameters `params` (target_parameters)."""
    return build_adapter(
        base, out, r=r, alpha=alpha, targets=list(targets), seed=seed, target_parameters=list(params or []), **kw
    )


def build_module_adapter(base: Path, out: Path, arch: str, *, r=4, alpha=8, seed=3, layers=(0,)) -> Path:
    """A hand-written per-expert-module adapter (experts.{e}.w1/w2/w3 or gate_proj/up_proj/down_proj), as stacks
    before transformers 5 saved them. PEFT loads it onto transformers 5's fused experts by its own conversion
    (Mixtral, Qwen3-MoE); on Qwen2-MoE it does not (its target_modules match the shared expert's real modules, and
    the expert tensors are dropped), so `merged_module_adapter` is the reference there."""
    cfg = json.loads((Path(base) / "config.json").read_text())
    hidden = cfg["hidden_size"]
    names = ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    block = "block_sparse_moe" if arch == "mixtral" else "mlp"
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in layers:
        for e in range(E):
            for n in names:
                i, o = (I_E, hidden) if n in ("w2", "down_proj") else (hidden, I_E)
                pre = f"base_model.model.model.layers.{layer}.{block}.experts.{e}.{n}"
                tensors[f"{pre}.lora_A.weight"] = torch.randn(r, i, generator=g) * 0.1
                tensors[f"{pre}.lora_B.weight"] = torch.randn(o, r, generator=g) * 0.1
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = dict(peft_type="LORA", r=r, lora_alpha=alpha, target_modules=list(names), lora_dropout=0.0)
    config["base_model_name_or_path"] = str(base)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def merged_module_adapter(base: Path, adapter: Path, arch: str):
    """A per-expert-module adapter merged by hand: the base with s * B A added to each expert's weights (what PEFT's
    conversion computes on Mixtral and Qwen3-MoE: tests/models/test_moe.py checks they agree)."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(adapter) / "adapter_config.json").read_text())
    s = cfg["lora_alpha"] / cfg["r"]
    model = hf_model(base)
    t = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    part = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1, "w2": 2, "down_proj": 2}
    with torch.no_grad():
        for key, a in t.items():
            if ".lora_A." not in key:
                continue
            b = t[key.replace(".lora_A.", ".lora_B.")]
            bits = key.split(".")
            layer, e, name = int(bits[bits.index("layers") + 1]), int(bits[bits.index("experts") + 1]), bits[-3]
            experts = model.model.layers[layer].mlp.experts
            delta = s * b @ a
            p = part[name]
            if p == 2:
                experts.down_proj[e] += delta
            else:
                half = experts.gate_up_proj.shape[1] // 2
                experts.gate_up_proj[e, p * half : (p + 1) * half] += delta
    return model
