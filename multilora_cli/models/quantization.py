"""Which quantized base models multilora serves, read from config.json, and a clear refusal for the rest.

Served (`parse_quantization` -> `Fp8Format`):
- compressed-tensors `format: "float-quantized"` (llm-compressor's FP8 / FP8-dynamic): every decoder projection
  float8_e4m3fn with `weight_scale` fp32 per tensor ([1] / []) or per output channel ([out, 1]); activations
  static (`input_scale` [1], `dynamic: false, strategy: tensor`), dynamic per token (`dynamic: true, strategy:
  token`) or none (weight-only); `ignore` may name modules outside the decoder projections (lm_head);
- fbgemm_fp8: e4m3 weights, `weight_scale` [out, 1], dynamic per-token activations whose absmax is clamped to
  `activation_scale_ub`; `modules_to_not_convert` may name lm_head;
- `--quantization fp8` on a bf16 / fp16 / fp32 checkpoint (`ONLINE`): per-channel scales, dynamic activations.
Everything else is refused with one UnsupportedModelError naming the method: AWQ, GPTQ, bitsandbytes, GGUF, FP8
with block-wise scales (`weight_block_size`, strategy "block"), int8 / int4 compressed-tensors, a quantized KV
cache, partly quantized decoders, unknown methods.

Without a quantization_config, a checkpoint whose safetensors headers hold 8-bit (or narrower) weights or a
quantizer's extra tensors (`*.weight_scale`, `*.qweight`, `*.SCB`, ...) is refused too (only headers are read).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from multilora_cli.errors import UnsupportedModelError
from multilora_cli.kernels.fp8 import DEFAULT_SMALL_M, Fp8Scheme

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
HINT = (
    "multilora serves FP8 checkpoints (compressed-tensors float-quantized with per-tensor or per-channel scales, "
    "fbgemm_fp8) and --quantization fp8 on a bfloat16 / float16 checkpoint; use one of those or the unquantized "
    "checkpoint of this model"
)
QUANTIZATIONS = ("none", "fp8")  # values of `run --quantization`
FBGEMM_SCALE_UB = 1200.0  # transformers' FbgemmFp8Config default activation_scale_ub


@dataclass(frozen=True, slots=True)
class Fp8Format:
    """An FP8 base: where it comes from, its weight scales ("tensor" | "channel"), its activations ("dynamic" per
    token | "static" per tensor | "none": weight-only), and fbgemm's per-token absmax bound."""

    method: str  # "compressed-tensors" | "fbgemm_fp8" | "fp8" (quantized while loading: --quantization fp8)
    weights: str = "channel"
    activations: str = "dynamic"
    scale_ub: float | None = None

    def __post_init__(self) -> None:
        if self.weights not in ("tensor", "channel"):
            raise ValueError(f"weights must be 'tensor' or 'channel', got {self.weights!r}")
        Fp8Scheme(self.activations, self.scale_ub)  # validates the rest

    @property
    def online(self) -> bool:
        """Quantized from a bf16 / fp16 / fp32 checkpoint while loading (not an FP8 checkpoint)."""
        return self.method == "fp8"

    def scheme(self, small_m: int = DEFAULT_SMALL_M) -> Fp8Scheme:
        """How its layers run (kernels/fp8.py), cuBLAS from `small_m` tokens."""
        return Fp8Scheme(self.activations, self.scale_ub, small_m)

    def describe(self) -> str:
        """One line for inspect / economics / bench: 'fp8 e4m3 (compressed-tensors, per-channel weights, ...)'."""
        src = "quantized at load" if self.online else self.method
        act = {"dynamic": "dynamic per-token", "static": "static per-tensor", "none": "unquantized (weight-only)"}
        ub = f" <= {self.scale_ub:g}" if self.scale_ub is not None else ""
        return f"fp8 e4m3 ({src}, per-{self.weights} weight scales, {act[self.activations]}{ub} activations)"


ONLINE = Fp8Format("fp8")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_params(config) -> int:
    """Parameters of every decoder projection (what an FP8 base stores in one byte each); config: ModelConfig."""
    return config.num_hidden_layers * sum(i * o for i, o in map(config.linear_shape, PROJECTIONS))


def base_bytes(config, itemsize: int, fp8: bool) -> int:
    """Bytes of the base's parameters (config.num_params(): embeddings, norms, LM head included) at `itemsize`,
    the decoder projections at 1 byte + an fp32 scale per output channel when `fp8`."""
    total = config.num_params() * itemsize
    if not fp8:
        return total
    proj = projection_params(config)
    channels = config.num_hidden_layers * sum(o for _, o in map(config.linear_shape, PROJECTIONS))
    return total - proj * itemsize + proj + 4 * channels


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


def _refuse(where: str, method: str, why: str = "") -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{where}: the base model is quantized ({method}{', ' + why if why else ''}; quantization_config in "
        "config.json), which multilora does not serve: its weights would load without their scales",
        hint=HINT,
    )


# each decoder projection: its parent and the HF names it may have (split, or Phi-3's fused one)
ROLES = {
    "q_proj": ("self_attn", ("q_proj", "qkv_proj")),
    "k_proj": ("self_attn", ("k_proj", "qkv_proj")),
    "v_proj": ("self_attn", ("v_proj", "qkv_proj")),
    "o_proj": ("self_attn", ("o_proj",)),
    "gate_proj": ("mlp", ("gate_proj", "gate_up_proj")),
    "up_proj": ("mlp", ("up_proj", "gate_up_proj")),
    "down_proj": ("mlp", ("down_proj",)),
}


def _decoder_names(num_layers: int) -> list[list[str]]:
    """Per decoder projection (layer x role), the HF module names it may have."""
    return [
        [f"model.layers.{i}.{parent}.{n}" for n in names] for i in range(num_layers) for parent, names in ROLES.values()
    ]


def _matches(entry: str, name: str) -> bool:
    """compressed-tensors' target / ignore matching: 're:<regex>' (re.match), else the module name (or a
    dotted suffix of it) or a class name ('Linear' matches every projection)."""
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return entry == "Linear" or name == entry or name.endswith("." + entry)


def _compressed_tensors(q: dict, num_layers: int, where: str) -> Fp8Format:
    method = quant_method({"quantization_config": q}) or "compressed-tensors"
    if q.get("format") != "float-quantized":
        raise _refuse(where, method, "only the float-quantized (FP8) format is served")
    if q.get("kv_cache_scheme"):
        raise _refuse(where, method, "an FP8 KV cache (kv_cache_scheme) is not served")
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise _refuse(where, method, "no config_groups")
    roles = _decoder_names(num_layers)
    ignore = [e for e in q.get("ignore") or [] if isinstance(e, str)]
    hit = next((n for r in roles for n in r for e in ignore if _matches(e, n)), None)
    if hit is not None:
        raise _refuse(where, method, f"its ignore list leaves decoder projection {hit} unquantized")
    formats, covered = set(), set()
    for gname, g in groups.items():
        w, a = (g or {}).get("weights") or {}, (g or {}).get("input_activations")
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise _refuse(where, method, f"group {gname} weights are {w.get('type')}{w.get('num_bits')}, not fp8")
        strategy = w.get("strategy")
        if strategy in ("block", "group") or w.get("block_structure"):
            raise _refuse(where, method, f"block-wise FP8 weight scales (strategy {strategy!r})")
        if strategy not in ("tensor", "channel") or w.get("symmetric") is False or w.get("dynamic"):
            raise _refuse(where, method, f"group {gname} weight strategy {strategy!r}")
        if not a:
            acts = "none"
        elif a.get("type") != "float" or a.get("num_bits") != 8:
            raise _refuse(where, method, f"group {gname} activations are {a.get('type')}{a.get('num_bits')}")
        elif a.get("dynamic") is True and a.get("strategy") == "token":
            acts = "dynamic"
        elif a.get("dynamic") is False and a.get("strategy") == "tensor":
            acts = "static"
        else:
            raise _refuse(where, method, f"group {gname} activations {a.get('strategy')!r} dynamic={a.get('dynamic')}")
        formats.add((strategy, acts))
        targets = [t for t in g.get("targets") or [] if isinstance(t, str)]
        covered |= {n for r in roles for n in r if any(_matches(t, n) for t in targets)}
    if len(formats) > 1:
        raise _refuse(where, method, f"config groups of different schemes {sorted(formats)}")
    missing = next((r[0] for r in roles if not covered.intersection(r)), None)
    if missing is not None:
        raise _refuse(where, method, f"its targets leave decoder projection {missing} unquantized")
    ((strategy, acts),) = formats
    return Fp8Format("compressed-tensors", strategy, acts)


def _fbgemm(q: dict, num_layers: int, where: str) -> Fp8Format:
    # transformers skips a module when an entry of modules_to_not_convert occurs in its name
    skip = [e for e in q.get("modules_to_not_convert") or [] if isinstance(e, str) and e]
    hit = next((n for r in _decoder_names(num_layers) for n in r for e in skip if e in n), None)
    if hit is not None:
        raise _refuse(where, "fbgemm_fp8", f"modules_to_not_convert leaves decoder projection {hit} unquantized")
    ub = q.get("activation_scale_ub", FBGEMM_SCALE_UB)
    return Fp8Format("fbgemm_fp8", "channel", "dynamic", float(ub) if ub is not None else None)


def parse_quantization(cfg: dict, where: str) -> Fp8Format | None:
    """The FP8 format config dict `cfg` (of `where`) declares, None for none; any other quantization raises
    UnsupportedModelError naming its method."""
    method = quant_method(cfg)
    if method is None:
        return None
    q = next(cfg[k] for k in CONFIG_KEYS if cfg.get(k))
    name = q.get("quant_method") if isinstance(q, dict) else None
    layers = int(cfg.get("num_hidden_layers") or 0)
    if name == "compressed-tensors":
        return _compressed_tensors(q, layers, where)
    if name == "fbgemm_fp8":
        return _fbgemm(q, layers, where)
    if name == "fp8" and q.get("weight_block_size"):
        raise _refuse(where, method, f"block-wise FP8 weight scales (weight_block_size {q['weight_block_size']})")
    raise _refuse(where, method)


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
            "quantization_config saying how to read them; multilora refuses to guess",
            hint=HINT,
        )
