"""`ModelConfig`: the subset of a Hugging Face `config.json` a decoder multilora serves needs.

Covers Llama 2/3/3.1 (rope_scaling "llama3"), Mistral (sliding window), Qwen2 (qkv bias), Qwen3 (q/k RMSNorm,
explicit head_dim), Gemma 2 and Gemma 3 text (models/hf_config.py lists what differs), Phi-3 / Phi-4 dense (fused
checkpoint projections, LongRoPE), tied embeddings, and transformers v5 `rope_parameters`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from multilora_cli.errors import ModelError, UnsupportedModelError
from multilora_cli.models import hf_config
from multilora_cli.models.moe_config import (
    DENSE_TWIN,
    MOE_MODEL_TYPES,
    SHARED_MODULES,
    MoeSpec,
    moe_attention_fields,
    moe_spec,
    moe_weight_numel,
)
from multilora_cli.models.quantization import Fp8Format, parse_quantization, refuse_quantized_weights

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", *MOE_MODEL_TYPES)

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
# Phi-3 checkpoints (base and PEFT adapters) hold the fused projections themselves: name -> its slices, in order
CHECKPOINT_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# every linear module name a served checkpoint may hold, in display order
CHECKPOINT_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "qkv_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "gate_up_proj",
    "down_proj",
)
PHI3_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


RUN_ADAPTER_HINT = (
    "pass it with --adapters, and the base model with --model (or leave --model out to use the "
    "adapter's base_model_name_or_path)"
)


@dataclass(slots=True)
class ModelConfig:
    """Architecture of a served decoder. Build with `ModelConfig.from_dict` / `from_dir`. The fields after
    `layer_types` default to Llama's behaviour; Gemma and Phi-3 set them (models/hf_config.py)."""

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
    layer_types: list[str] | None = None  # per layer "full_attention" | "sliding_attention", None = all alike
    hidden_act: str = "silu"  # MLP activation: silu (SwiGLU) | gelu_pytorch_tanh (GeGLU, Gemma)
    norm_offset: bool = False  # Gemma RMSNorm: float32 (x / rms) * (1 + weight), then cast
    sandwich_norms: bool = False  # Gemma: norms after attention and around the MLP (4 per layer)
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden_size), in the model dtype
    query_pre_attn_scalar: float | None = None  # Gemma: attention scale = this ** -0.5 (None: head_dim ** -0.5)
    attn_softcap: float | None = None  # Gemma 2: attention logits -> tanh(x / cap) * cap
    final_softcap: float | None = None  # Gemma 2: output logits -> tanh(x / cap) * cap
    rope_local_theta: float | None = None  # Gemma 3: RoPE base of sliding layers (None: rope_theta everywhere)
    rope_local_scaling: dict | None = None  # Gemma 3: rope scaling of sliding layers
    partial_rotary_factor: float = 1.0  # Phi-3 family: rotate the first head_dim * factor dims only
    fused_checkpoint: bool = False  # Phi-3: qkv_proj / gate_up_proj are single tensors in checkpoints and adapters
    moe: MoeSpec | None = None  # Mixtral, Qwen2-MoE, Qwen3-MoE: the sparse blocks (models/moe_config.py)
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name_or_path: str = ""
    quantization: Fp8Format | None = None  # an FP8 checkpoint (models/quantization.py); None: unquantized weights

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
        if self.hidden_act not in hf_config.ACTIVATIONS:
            raise UnsupportedModelError(
                f"config.json: activation {self.hidden_act!r} is not supported",
                hint=f"served: {', '.join(hf_config.ACTIVATIONS)}",
            )
        for name in ("attn_softcap", "final_softcap", "query_pre_attn_scalar"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ModelError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ModelError(
                f"config.json: partial_rotary_factor {self.partial_rotary_factor} does not give an even rotary "
                f"dimension of head_dim {self.head_dim}"
            )

    # Shapes -------------------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that RoPE rotates (head_dim unless partial_rotary_factor < 1)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attn_scale(self) -> float:
        """Softmax scale of attention: query_pre_attn_scalar ** -0.5 (Gemma), else head_dim ** -0.5."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def peft_modules(self) -> tuple[str, ...]:
        """The linear module names of one layer in this model's checkpoints (what PEFT adapters target)."""
        if self.moe is not None and self.moe.shared_intermediate_size:  # Qwen2-MoE: its shared expert too
            return LINEAR_MODULES + SHARED_MODULES
        return PHI3_MODULES if self.fused_checkpoint else LINEAR_MODULES

    def linear_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a PEFT-named linear module (q_proj ... down_proj, and Phi-3's fused
        qkv_proj / gate_up_proj)."""
        h, i = self.hidden_size, self.intermediate_size
        if module.startswith("shared_expert.") and self.moe is not None and self.moe.shared_intermediate_size:
            s = self.moe.shared_intermediate_size  # Qwen2-MoE's shared expert: a dense SwiGLU of width s
            return (s, h) if module == "shared_expert.down_proj" else (h, s)
        shapes = {
            "q_proj": (h, self.q_size),
            "k_proj": (h, self.kv_size),
            "v_proj": (h, self.kv_size),
            "o_proj": (self.q_size, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
            "qkv_proj": (h, self.q_size + 2 * self.kv_size),
            "gate_up_proj": (h, 2 * i),
        }
        if module not in shapes:
            raise KeyError(module)
        return shapes[module]

    def checkpoint_slices(self, module: str) -> list[tuple[str, int]]:
        """A fused checkpoint module's slices as (PEFT name of the slice, output rows), in row order:
        qkv_proj -> q, k, v; gate_up_proj -> gate, up. KeyError for other names."""
        return [(name, self.linear_shape(name)[1]) for name in CHECKPOINT_FUSED[module]]

    def layer_sliding_window(self, layer: int) -> int | None:
        """Sliding window of decoder layer `layer` (None = full attention)."""
        if not self.sliding_window:
            return None
        if self.layer_types and layer < len(self.layer_types) and self.layer_types[layer] != "sliding_attention":
            return None
        return int(self.sliding_window)

    @property
    def kv_window(self) -> int | None:
        """The window W every decoder layer slides with (Mistral, Phi-3, a Qwen2 whose layers all slide), or None
        when any layer attends to the whole context. With W, no query at position >= p reads a key at a position
        <= p - W in any layer, so the engine releases such KV blocks (engine/block_manager.py). Gemma 2 / 3 mix
        global layers in: their KV blocks are all kept (the cache is one block table for every layer)."""
        windows = {self.layer_sliding_window(i) for i in range(self.num_hidden_layers)}
        return windows.pop() if len(windows) == 1 and None not in windows else None

    def layer_rope(self, layer: int) -> str:
        """Which RoPE decoder layer `layer` uses: "local" (Gemma 3 sliding layers: rope_local_theta) or "global"."""
        kinds = self.layer_types or []
        if self.rope_local_theta is not None and layer < len(kinds) and kinds[layer] == "sliding_attention":
            return "local"
        return "global"

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` holds a sparse MoE block (models/moe.py) instead of a dense MLP."""
        return self.moe is not None and layer in self.moe.sparse_layers

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K + V cache bytes of one token over all layers."""
        return 2 * self.num_hidden_layers * self.kv_size * dtype_bytes

    def num_params(self) -> int:
        """Parameter count of the base model (embeddings and lm_head included)."""
        per_layer = sum(a * b for a, b in (self.linear_shape(m) for m in LINEAR_MODULES))
        per_layer += (4 if self.sandwich_norms else 2) * self.hidden_size
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.attention_bias:
            per_layer += self.q_size + 2 * self.kv_size
        emb = self.vocab_size * self.hidden_size
        if self.moe is not None:  # matrices counted expert by expert (models/moe_config.py)
            per_layer -= sum(a * b for a, b in (self.linear_shape(m) for m in LINEAR_MODULES))
            return (
                moe_weight_numel(self)
                + self.num_hidden_layers * per_layer
                + emb * (1 if self.tie_word_embeddings else 2)
                + self.hidden_size
            )
        return self.num_hidden_layers * per_layer + emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    # Parsing ------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, cfg: dict, name_or_path: str = "") -> ModelConfig:
        """Parse a HF config dict (transformers v4 or v5 layout). An architecture or a quantization multilora does
        not serve raises UnsupportedModelError (before any field is read: a gpt2 config lacks Llama's names)."""
        where = name_or_path or "config.json"
        quantization = parse_quantization(cfg, where)
        outer = cfg.get("model_type")
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
            quantization = parse_quantization(cfg, where) or quantization
        mt = cfg.get("model_type")
        if mt is None:
            raise ModelError(f"{where}: no model_type in config.json")
        if mt == "gemma3_text" and outer == "gemma3":
            raise UnsupportedModelError(
                f"{where}: multimodal Gemma 3 checkpoints (Gemma3ForConditionalGeneration) are not supported",
                hint="multilora serves text-only Gemma 3 (Gemma3ForCausalLM, model type gemma3_text)",
            )
        if mt not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{where}: model type {mt!r} is not supported",
                hint=f"multilora serves {', '.join(SUPPORTED_MODEL_TYPES)}",
            )
        try:
            if mt in hf_config.GEMMA_FAMILY:
                fields = hf_config.gemma_fields(mt, cfg, where)
            elif mt == "phi3":
                fields = hf_config.phi3_fields(cfg, where)
            elif mt in MOE_MODEL_TYPES:
                fields = hf_config.llama_fields(DENSE_TWIN[mt], cfg, where)
                fields.update(moe_attention_fields(mt, cfg), moe=moe_spec(mt, cfg, fields["num_hidden_layers"]))
            else:
                fields = hf_config.llama_fields(mt, cfg, where)
            name = name_or_path or cfg.get("_name_or_path", "")
            return cls(model_type=mt, **fields, name_or_path=name, quantization=quantization)
        except KeyError as e:
            raise ModelError(f"{where}: config.json lacks {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelError(f"{where}: bad value in config.json: {e}") from None

    @classmethod
    def from_dir(cls, path: str | Path, adapter_hint: str = RUN_ADAPTER_HINT) -> ModelConfig:
        """Read `<path>/config.json`. adapter_hint: what to do when `path` is an adapter folder (the default names
        `run`'s flags; commands with other flags pass their own). A checkpoint whose safetensors headers show
        quantized weights without a quantization_config saying how to read them is refused (UnsupportedModelError)."""
        p = Path(path) / "config.json"
        if not p.is_file():
            # GGUF (llama.cpp) only: a repo shipping safetensors beside GGUF files is served from the safetensors
            if (Path(path).is_file() and Path(path).suffix == ".gguf") or any(Path(path).glob("*.gguf")):
                raise UnsupportedModelError(
                    f"{path}: a GGUF (llama.cpp) model, which multilora does not serve",
                    hint="use the Hugging Face safetensors checkpoint of this model (FP8 ones are served too)",
                )
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
        if config.quantization is None:
            refuse_quantized_weights(path)
        return config
