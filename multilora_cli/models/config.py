"""`ModelConfig`: the subset of a Hugging Face `config.json` a Llama-family model needs.

Covers Llama 2/3/3.1 (rope_scaling "llama3"), Mistral, Qwen2 (qkv bias), Qwen3 (q/k RMSNorm, explicit
head_dim), tied embeddings, and transformers v5 `rope_parameters`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from multilora_cli.errors import ModelError, UnsupportedModelError
from multilora_cli.models.quantization import refuse_quantized_config, refuse_quantized_weights

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# PEFT module names of a Llama-family decoder layer, and which fused module/slice each maps to.
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LINEAR_MODULES = ATTN_MODULES + MLP_MODULES
FUSED = {  # peft name -> (our fused module, slice index)
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}
FUSED_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


RUN_ADAPTER_HINT = (
    "pass it with --adapters, and the base model with --model (or leave --model out to use the "
    "adapter's base_model_name_or_path)"
)


@dataclass(slots=True)
class ModelConfig:
    """Architecture of a Llama-family decoder. Build with `ModelConfig.from_dict` / `from_dir`."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # normalised: {"rope_type": "llama3", "factor": ..., ...} or None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v (and o for llama if set) carry a bias: Qwen2
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    sliding_window: int | None = None
    layer_types: list[str] | None = None  # per layer "full_attention" | "sliding_attention" (Qwen2/3), None = all alike
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name_or_path: str = ""

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model type {self.model_type!r} is not supported",
                hint=f"multilora serves {', '.join(SUPPORTED_MODEL_TYPES)}",
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            if int(getattr(self, name)) <= 0:
                raise ModelError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelError("config.json: num_attention_heads must be a multiple of num_key_value_heads")

    # Shapes -------------------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def linear_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a PEFT-named linear module (q_proj ... down_proj)."""
        h, i = self.hidden_size, self.intermediate_size
        shapes = {
            "q_proj": (h, self.q_size),
            "k_proj": (h, self.kv_size),
            "v_proj": (h, self.kv_size),
            "o_proj": (self.q_size, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        if module not in shapes:
            raise KeyError(module)
        return shapes[module]

    def layer_sliding_window(self, layer: int) -> int | None:
        """Sliding window of decoder layer `layer` (None = full attention)."""
        if not self.sliding_window:
            return None
        if self.layer_types and layer < len(self.layer_types) and self.layer_types[layer] != "sliding_attention":
            return None
        return int(self.sliding_window)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K + V cache bytes of one token over all layers."""
        return 2 * self.num_hidden_layers * self.kv_size * dtype_bytes

    def num_params(self) -> int:
        """Parameter count of the base model (embeddings and lm_head included)."""
        per_layer = sum(a * b for a, b in (self.linear_shape(m) for m in LINEAR_MODULES))
        per_layer += 2 * self.hidden_size
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.attention_bias:
            per_layer += self.q_size + 2 * self.kv_size
        emb = self.vocab_size * self.hidden_size
        return self.num_hidden_layers * per_layer + emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    # Parsing ------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, cfg: dict, name_or_path: str = "") -> ModelConfig:
        """Parse a HF config dict (transformers v4 or v5 layout). An architecture or a quantization multilora does
        not serve raises UnsupportedModelError (before any field is read: a gpt2 config lacks Llama's names)."""
        where = name_or_path or "config.json"
        refuse_quantized_config(cfg, where)
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
            refuse_quantized_config(cfg, where)
        mt = cfg.get("model_type")
        if mt is None:
            raise ModelError(f"{where}: no model_type in config.json")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{where}: model type {mt!r} is not supported",
                hint=f"multilora serves {', '.join(SUPPORTED_MODEL_TYPES)}",
            )
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            head_dim = cfg.get("head_dim") or hidden // heads
            rope = cfg.get("rope_parameters") or {}
            rope_theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
            scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
            if scaling is not None:
                scaling = dict(scaling)
                scaling["rope_type"] = scaling.get("rope_type") or scaling.get("type")
                if scaling["rope_type"] in (None, "default"):
                    scaling = None
                elif scaling["rope_type"] not in ("llama3", "linear"):
                    raise UnsupportedModelError(
                        f"{name_or_path or 'config.json'}: rope scaling {scaling['rope_type']!r} is not supported",
                        hint="supported: llama3, linear",
                    )
            eos = cfg.get("eos_token_id")
            eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
            bias = bool(cfg.get("attention_bias", mt == "qwen2"))
            return cls(
                model_type=mt,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=scaling,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bias,
                o_bias=bias and mt == "llama",
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                qk_norm=mt == "qwen3",
                sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", mt == "mistral") else None,
                layer_types=cfg.get("layer_types"),
                torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                name_or_path=name_or_path or cfg.get("_name_or_path", ""),
            )
        except KeyError as e:
            raise ModelError(f"{name_or_path or 'config.json'}: config.json lacks {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelError(f"{name_or_path or 'config.json'}: bad value in config.json: {e}") from None

    @classmethod
    def from_dir(cls, path: str | Path, adapter_hint: str = RUN_ADAPTER_HINT) -> ModelConfig:
        """Read `<path>/config.json`. adapter_hint: what to do when `path` is an adapter folder (the default names
        `run`'s flags; commands with other flags pass their own). A checkpoint whose safetensors headers show
        quantized weights is refused like a declared quantization (UnsupportedModelError)."""
        p = Path(path) / "config.json"
        if not p.is_file():
            if (Path(path) / "adapter_config.json").is_file():
                raise ModelError(
                    f"{path}: this is a LoRA adapter folder (adapter_config.json), not a base model", hint=adapter_hint
                )
            raise ModelError(
                f"{path}: no config.json", hint="point --model at a Hugging Face model directory or Hub id"
            )
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise ModelError(f"{p}: unreadable config.json: {e}") from None
        config = cls.from_dict(cfg, name_or_path=str(path))
        refuse_quantized_weights(path)
        return config
