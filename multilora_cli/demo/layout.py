"""Write the demo's files in the layouts real tools use: a Hugging Face model directory and PEFT adapters.

JSON is written with sorted keys and safetensors without timestamps, so identical tensors give identical bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def llama_config(
    vocab_size: int,
    bos: int,
    eos: list[int],
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    max_len: int,
) -> dict:
    """A transformers-compatible `config.json` dict for a small Llama."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": bos,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
    }


def write_base(out: Path, cfg: dict, weights: dict[str, torch.Tensor], gen_eos: list[int], max_new_tokens: int) -> None:
    """config.json, generation_config.json and model.safetensors (HF tensor names, contiguous float32)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", cfg)
    write_json(
        out / "generation_config.json",
        {
            "bos_token_id": cfg["bos_token_id"],
            "eos_token_id": gen_eos,
            "do_sample": False,
            "max_new_tokens": max_new_tokens,
        },
    )
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in sorted(weights.items())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def write_adapter(
    out: Path,
    base_path: Path,
    lora: dict[str, tuple[torch.Tensor, torch.Tensor, float]],
    *,
    r: int,
    alpha: float,
    targets: list[str],
    use_rslora: bool,
) -> None:
    """adapter_config.json + adapter_model.safetensors in PEFT's layout.

    `lora` maps HF module paths (model.layers.0.self_attn.q_proj) to (A: [r, in], B: [out, r], scaling);
    PEFT stores them as base_model.model.<path>.lora_A.weight / lora_B.weight."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(
        out / "adapter_config.json",
        {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": str(base_path.resolve()),
            "r": r,
            "lora_alpha": alpha,
            "use_rslora": use_rslora,
            "target_modules": list(targets),
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": False,
            "use_dora": False,
            "modules_to_save": None,
            "layers_to_transform": None,
            "layers_pattern": None,
            "rank_pattern": {},
            "alpha_pattern": {},
            "init_lora_weights": True,
            "inference_mode": True,
            "revision": None,
        },
    )
    tensors = {}
    for path, (a, b, _) in sorted(lora.items()):
        tensors[f"base_model.model.{path}.lora_A.weight"] = a.to(torch.float32).contiguous()
        tensors[f"base_model.model.{path}.lora_B.weight"] = b.to(torch.float32).contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
