"""Refuse quantized base models: multilora serves bf16 / fp16 / fp32 weights only (for now).

A quantized checkpoint would otherwise load as if it were not: its int8 / fp8 / packed weights copied as plain
numbers, their scales ignored, the text garbage and the exit code 0. Two signs, either enough:
- config.json names a method: `quantization_config` (or compressed-tensors' older `compression_config`), whatever
  its `quant_method` (fp8, compressed-tensors, fbgemm_fp8, awq, gptq, bitsandbytes, ...);
- without one, the safetensors headers hold a `*.weight` of an 8-bit (or narrower) dtype, or the tensors
  quantizers add beside the weights (`*.weight_scale`, `*.qweight`, `*.qzeros`, `*.SCB`, ...).
Only headers are read (8 bytes + a JSON object per file), never tensor data.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from multilora_cli.errors import UnsupportedModelError

CONFIG_KEYS = ("quantization_config", "compression_config")
# safetensors dtype names of quantized weights (8 bits or fewer); a float8 checkpoint is E4M3 or E5M2
QUANT_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "I8", "U8", "I4", "U4"}
# tensors quantizers write beside (or instead of) a weight: fp8 scales, GPTQ / AWQ packs, bitsandbytes states
QUANT_SUFFIXES = (
    ".weight_scale",
    ".weight_scale_inv",
    ".input_scale",
    ".weight_packed",
    ".weight_zero_point",
    ".weight_global_scale",
    ".qweight",
    ".qzeros",
    ".scales",
    ".g_idx",
    ".SCB",
    ".weight.absmax",
    ".weight.quant_map",
)
HINT = "use the unquantized (bfloat16 / float16) checkpoint of this model"


def quant_method(cfg: dict) -> str | None:
    """The quantization config.json declares ("fp8", "compressed-tensors (float-quantized)", ...), else None."""
    for key in CONFIG_KEYS:
        q = cfg.get(key)
        if not q:
            continue
        if not isinstance(q, dict):
            return f"{key} {q!r}"
        method = q.get("quant_method") or ("bitsandbytes" if q.get("load_in_4bit") or q.get("load_in_8bit") else None)
        method = str(method or "unnamed")
        fmt = q.get("format")
        return f"{method} ({fmt})" if isinstance(fmt, str) and fmt else method
    return None


def refuse_quantized_config(cfg: dict, where: str) -> None:
    """Raise UnsupportedModelError when config dict `cfg` (of `where`) declares a quantization."""
    method = quant_method(cfg)
    if method is not None:
        raise UnsupportedModelError(
            f"{where}: the base model is quantized ({method}, quantization_config in config.json), which multilora "
            "does not serve yet: its weights would load without their scales and the text would be garbage",
            hint=HINT,
        )


def _header(file: Path) -> dict:
    """The JSON header of a safetensors file ({} when it cannot be read: the loader reports that itself)."""
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:  # not a safetensors header; let the loader say so
                return {}
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError):
        return {}
    return header if isinstance(header, dict) else {}


def _checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files the loader reads (sharded index or model.safetensors); [] when there are none."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return sorted({path / f for f in weight_map.values() if isinstance(f, str) and (path / f).is_file()})
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def quantized_tensor(path: str | Path) -> str | None:
    """Where the model folder's safetensors headers show quantization: '<weight> is <dtype> in <file>' for the
    first 8-bit (or narrower) weight, else '<tensor> in <file>' for a quantizer's extra tensor; None for neither."""
    extra = None
    for file in _checkpoint_files(Path(path)):
        header = _header(file)
        for name in sorted(header):
            info = header[name]
            dtype = info.get("dtype") if isinstance(info, dict) else None
            if name.endswith(".weight") and dtype in QUANT_DTYPES:
                return f"{name} is {dtype} in {file.name}"
            if extra is None and name.endswith(QUANT_SUFFIXES):
                extra = f"{name} in {file.name}"
    return extra


def refuse_quantized_weights(path: str | Path) -> None:
    """Raise UnsupportedModelError when the checkpoint's headers show quantized weights (no config needed)."""
    found = quantized_tensor(path)
    if found is not None:
        raise UnsupportedModelError(
            f"{path}: the checkpoint holds quantized weights ({found}), though config.json declares no "
            "quantization_config; multilora does not serve quantized models yet",
            hint=HINT,
        )
