"""Write FP8 checkpoints of a tiny HF model the way the real tools lay them out, and their dequantized twins.

- compressed-tensors (llm-compressor "FP8" / "FP8-dynamic" / weight-only): every decoder `*_proj.weight`
  float8_e4m3fn, `*_proj.weight_scale` float32 [1] (strategy tensor) or [out, 1] (strategy channel), static
  activations' `*_proj.input_scale` float32 [1]; config.json `quantization_config` with quant_method
  compressed-tensors, format float-quantized, config_groups targets ["Linear"], ignore ["lm_head"];
- fbgemm_fp8 (transformers' FbgemmFp8Linear): `weight` e4m3, `weight_scale` [out, 1], `input_scale_ub` [1];
  `quantization_config` {quant_method: fbgemm_fp8, activation_scale_ub, modules_to_not_convert: ["lm_head"]}.
`dequantized` writes a plain fp32 checkpoint whose projections are the FP8 ones dequantized: what transformers
runs as the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max


def _is_proj(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def _quantize(w: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    if strategy == "tensor":
        scale = (w.abs().amax() / E4M3_MAX).reshape(1)  # [1]
        return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale
    scale = w.abs().amax(dim=1, keepdim=True) / E4M3_MAX  # [out, 1]
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def _input_absmax(base: Path) -> dict[str, float]:
    """Calibration: the largest |input| each projection sees over a few random prompts (llm-compressor's minmax
    observer does this over a calibration set)."""
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    seen: dict[str, float] = {}
    hooks = []
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.startswith("model.layers."):

            def hook(m, args, name=name):
                seen[name] = max(seen.get(name, 0.0), float(args[0].abs().max()))

            hooks.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        hf(torch.randint(0, hf.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(9)))
    for h in hooks:
        h.remove()
    return seen


def compressed_tensors(base: Path, out: Path, *, weights: str = "channel", activations: str = "dynamic") -> Path:
    """activations: "dynamic" (FP8-dynamic), "static" (FP8: calibrated input_scale) or "none" (weight-only)."""
    shutil.copytree(base, out)
    tensors = load_file(out / "model.safetensors")
    absmax = _input_absmax(base) if activations == "static" else {}
    for name in [n for n in tensors if _is_proj(n)]:
        tensors[name], scale = _quantize(tensors[name], weights)
        tensors[name.removesuffix("weight") + "weight_scale"] = scale
        if activations == "static":
            module = name.removesuffix(".weight")
            tensors[module + ".input_scale"] = torch.tensor([absmax[module] / E4M3_MAX])
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    w = {"num_bits": 8, "type": "float", "strategy": weights, "symmetric": True, "dynamic": False}
    w |= {"group_size": None, "block_structure": None, "observer": "minmax", "actorder": None}
    acts = {
        "dynamic": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True},
        "static": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False},
        "none": None,
    }[activations]
    qc = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "version": "0.9.1",
        "global_compression_ratio": 1.5,
        "kv_cache_scheme": None,
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": w, "input_activations": acts, "output_activations": None}
        },
    }
    _set_quantization_config(out, qc)
    return out


def fbgemm(base: Path, out: Path, *, scale_ub: float = 1200.0) -> Path:
    shutil.copytree(base, out)
    tensors = load_file(out / "model.safetensors")
    for name in [n for n in tensors if _is_proj(n)]:
        tensors[name], tensors[name.removesuffix("weight") + "weight_scale"] = _quantize(tensors[name], "channel")
        tensors[name.removesuffix("weight") + "input_scale_ub"] = torch.tensor([scale_ub])
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    qc = {"quant_method": "fbgemm_fp8", "activation_scale_ub": scale_ub, "modules_to_not_convert": ["lm_head"]}
    _set_quantization_config(out, qc)
    return out


def _set_quantization_config(out: Path, qc: dict) -> None:
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}, indent=2))


def dequantized_tensors(fp8_dir: Path) -> dict[str, torch.Tensor]:
    """The FP8 checkpoint's projections as fp32 (weight * weight_scale), other tensors as stored; no scales."""
    tensors = load_file(fp8_dir / "model.safetensors")
    out = {}
    for name, t in tensors.items():
        if name.endswith(("_scale", "_scale_ub")):
            continue
        if t.dtype == torch.float8_e4m3fn:
            t = t.float() * tensors[name.removesuffix("weight") + "weight_scale"].float()
        out[name] = t
    return out


def dequantized(fp8_dir: Path, out: Path) -> Path:
    """A plain fp32 HF checkpoint of the FP8 one's dequantized weights (no quantization_config)."""
    shutil.copytree(fp8_dir, out)
    save_file(dequantized_tensors(fp8_dir), out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
