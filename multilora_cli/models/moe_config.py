"""`MoeSpec`: the sparse mixture-of-experts part of a Mixtral, Qwen2-MoE or Qwen3-MoE `config.json`.

Routing per family, as transformers 5 computes it (router logits l = x Wg^T: [T, E]):
- mixtral:   p = softmax(float32(l)); top-k of p; w = p_topk / sum(p_topk)  (= softmax over the top-k logits)
- qwen*_moe: p = softmax(l, dtype=float32); top-k of p; w = p_topk / sum(p_topk) if norm_topk_prob; w cast back to
  the model dtype (Mixtral keeps float32 weights)
Qwen2-MoE adds a shared expert (SwiGLU of `shared_expert_intermediate_size`) gated by sigmoid(x Ws^T), [T, 1].
Which layers are sparse: all (Mixtral); Qwen: layer i unless i in mlp_only_layers, and (i + 1) % decoder_sparse_step
== 0 (the others keep a dense MLP of `intermediate_size`).
"""

from __future__ import annotations

from dataclasses import dataclass

from multilora_cli.errors import ModelError

MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
# Qwen2-MoE's shared expert: PEFT module names of its projections (LoRA targets like a dense MLP's), and our fused
# modules over them (slices in order), as adapters/peft.SLICES lists the dense ones
SHARED_MODULES = ("shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj")
SHARED_FUSED = {
    "shared_expert.gate_up_proj": ["shared_expert.gate_proj", "shared_expert.up_proj"],
    "shared_expert.down_proj": ["shared_expert.down_proj"],
}
# the dense type whose attention, norms and rope each MoE family shares
DENSE_TWIN = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """num_experts E, top_k, expert intermediate size I_e; router "mixtral" | "qwen"; sparse_layers: indices of the
    layers holding a sparse block (the others are dense)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    router: str
    norm_topk_prob: bool
    shared_intermediate_size: int  # Qwen2-MoE's shared expert; 0 = none
    sparse_layers: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_experts <= 0 or self.intermediate_size <= 0:
            raise ModelError(f"config.json: num_experts and the expert intermediate size must be positive: {self}")
        if not 0 < self.top_k <= self.num_experts:
            raise ModelError(f"config.json: num_experts_per_tok {self.top_k} must be in 1..{self.num_experts}")
        if self.router not in ("mixtral", "qwen"):
            raise ModelError(f"unknown router kind {self.router!r}")


def moe_spec(mt: str, cfg: dict, num_layers: int) -> MoeSpec:
    """Read the MoE fields of a Mixtral / Qwen2-MoE / Qwen3-MoE config dict, with transformers' defaults."""
    if mt == "mixtral":
        return MoeSpec(
            num_experts=int(cfg.get("num_local_experts", 8)),
            top_k=int(cfg.get("num_experts_per_tok", 2)),
            intermediate_size=int(cfg["intermediate_size"]),
            router="mixtral",
            norm_topk_prob=True,
            shared_intermediate_size=0,
            sparse_layers=tuple(range(num_layers)),
        )
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    # transformers 5 writes num_local_experts (num_experts is its attribute alias); Hub configs say num_experts
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or (60 if mt == "qwen2_moe" else 128))
    sparse = tuple(i for i in range(num_layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
    return MoeSpec(
        num_experts=experts,
        top_k=int(cfg.get("num_experts_per_tok", 4 if mt == "qwen2_moe" else 8)),
        intermediate_size=int(cfg.get("moe_intermediate_size", 1408 if mt == "qwen2_moe" else 768)),
        router="qwen",
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 5632)) if mt == "qwen2_moe" else 0,
        sparse_layers=sparse,
    )


def moe_attention_fields(mt: str, cfg: dict) -> dict:
    """Where a MoE family's attention differs from its dense twin's reading (hf_config.llama_fields), as the
    transformers 5 config classes set it: Mixtral always passes config.sliding_window (default None); Qwen3-MoE
    keeps sliding_window (default 4096) only with use_sliding_window, then on every layer; Qwen2-MoE's layer_types
    default to sliding on odd-numbered (1-based) layers below max_window_layers (default 28) with
    use_sliding_window. Qwen2-MoE: q/k/v bias from qkv_bias (default True), o_proj never; Qwen3-MoE: attention_bias
    on o_proj too."""
    use = bool(cfg.get("use_sliding_window", False))
    if mt == "mixtral":
        return {"sliding_window": cfg.get("sliding_window"), "layer_types": None}
    if mt == "qwen3_moe":
        bias = bool(cfg.get("attention_bias", False))
        window = cfg.get("sliding_window", 4096) if use else None
        return {"attention_bias": bias, "o_bias": bias, "sliding_window": window, "layer_types": None}
    layers = int(cfg["num_hidden_layers"])
    below = int(cfg.get("max_window_layers", 28))
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 and i < below and use else "full_attention" for i in range(layers)
    ]
    window = cfg.get("sliding_window", 4096) if use else None
    return {
        "attention_bias": bool(cfg.get("qkv_bias", True)),
        "o_bias": False,
        "sliding_window": window,
        "layer_types": list(types),
    }


_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def moe_weight_numel(config) -> int:
    """Matrix values of a MoE base's decoder layers (a `ModelConfig` with `moe`): attention everywhere, dense MLPs
    on the dense layers, E experts (+ router, + Qwen2-MoE's shared expert and gate) on the sparse ones."""
    spec, h = config.moe, config.hidden_size
    attn = sum(i * o for i, o in map(config.linear_shape, _ATTN))
    dense = sum(i * o for i, o in map(config.linear_shape, _MLP))
    sparse = spec.num_experts * (3 * h * spec.intermediate_size + h)
    if spec.shared_intermediate_size:  # shared expert [3 x S x H] and its gate [1, H]
        sparse += 3 * h * spec.shared_intermediate_size + h
    n_sparse = len(spec.sparse_layers)
    return attn * config.num_hidden_layers + dense * (config.num_hidden_layers - n_sparse) + sparse * n_sparse


def moe_slot_numel(config, max_rank: int) -> int:
    """Values of one adapter slot on a MoE base, as the engine allocates it: A [R, in] and B [out, R] of the attention
    projections in every layer and of the dense MLPs on dense layers (and the shared expert's), and the experts' slots
    (kernels/expert_weights.ExpertLoraWeights.slot_numel: E experts x rank) on every sparse layer."""
    from multilora_cli.kernels.expert_weights import ExpertLoraWeights

    spec = config.moe
    attn = sum(max_rank * sum(config.linear_shape(m)) for m in _ATTN)
    dense = sum(max_rank * sum(config.linear_shape(m)) for m in _MLP)
    experts = ExpertLoraWeights.slot_numel(max_rank, spec.num_experts, config.hidden_size, spec.intermediate_size)
    if spec.shared_intermediate_size:  # Qwen2-MoE's shared expert: gate, up, down LoRA like a dense MLP's
        experts += 3 * max_rank * (config.hidden_size + spec.shared_intermediate_size)
    n_sparse = len(spec.sparse_layers)
    return attn * config.num_hidden_layers + dense * (config.num_hidden_layers - n_sparse) + experts * n_sparse
