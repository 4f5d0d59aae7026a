"""How many GPU adapter slots a run gets when `--max-loras` is not given: `choose_max_loras`, the one rule that
`multilora run`, `multilora bench` and `multilora economics` share.

Why this rule: a step holds at most `max_loras` distinct adapters (engine/scheduler.py), so with many adapters of
few requests each the slots, not `max_num_seqs`, cap the decode batch. On an H100, Llama-3.2-1B shapes, 1,000
rank-16 adapters, 2,048 requests: 64 slots ran a decode batch of 64 and 19.2k tok/s, 256 slots batch 256 and
28.6k tok/s (issue 38). Slots cost only memory, so the default takes as many as fit beside what the run needs:

    left    = spare - kv_reserve          spare: GPU memory x utilization - base weights
    kv_reserve = max_num_seqs x context x KV bytes per token   (keeps max_num_seqs sequences resident)
    context = min(max_model_len, KV_RESERVE_CONTEXT)
    budget  = max(SLOT_SHARE x left, FLOOR_SHARE x spare)      (the floor: a KV-heavy model still gets slots)
    budget  = max(budget, (1 - KV_CAP_HEADROOM) x spare - kv_cap - staging)   (a bounded KV need: kv_cap)
    slots   = clamp(budget // slot bytes, 1, distinct adapters)

More slots than the run has adapters buy nothing. The rest of `left` goes to the KV cache (longer prompts,
prefix reuse), unless the KV cache can never use it: a run whose input bounds its sequences and their length
(`kv_cap`: every sequence at its longest, engine/runner_sizing.input_kv_blocks, or a bench's fixed KV) gives
slots the memory past that cap and the staging buffers the runner allocates beside the slots. Why: spare slots
take the next wave's adapters while this one runs (`SlotManager.preload`); with 64 MoE adapters of 1.7 GB, 20
slots left 4 free for 16 loads a wave and ~34 GB of an H200 unused (issue 37). On CPU no kernel gains from
slots and they cost host memory: the default stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

from multilora_cli.models.config import ModelConfig
from multilora_cli.models.moe_config import moe_slot_numel, moe_weight_numel

SLOT_SHARE = 0.5  # of the GPU memory left after the base weights and the KV reserve
FLOOR_SHARE = 0.10  # slots may always take this share of the memory beside the weights (the rule before issue 38)
KV_RESERVE_CONTEXT = 2048  # tokens per sequence the KV reserve holds (max_model_len when smaller)
CPU_MAX_LORAS = 8  # the default on CPU (vLLM's --max-loras default is 1)
# with a bounded KV need, this share of the spare memory stays unplanned: the weights' estimate leaves out norms
# and biases, and the runner keeps room for a step's activations before it sizes the KV cache
KV_CAP_HEADROOM = 0.05

# the PEFT projections behind the engine's fused LoRA modules (models/config.FUSED_MODULES); every one gets slots
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def slot_bytes(config: ModelConfig, max_rank: int, itemsize: int) -> int:
    """Bytes of one GPU slot: A [R, in] and B [out, R] of all seven projections in every layer (the engine
    allocates them whatever the adapters target); on a MoE base, the experts' slots too (E experts x rank)."""
    if config.moe is not None:
        return moe_slot_numel(config, max_rank) * itemsize
    per_layer = sum(max_rank * sum(config.linear_shape(m)) for m in PROJECTIONS)
    return per_layer * config.num_hidden_layers * itemsize


def weight_bytes(config: ModelConfig, itemsize: int, fp8: bool = False) -> int:
    """Bytes of the base model's matrices (embeddings, projections, LM head; norms and biases are noise); `fp8`:
    the decoder projections at 1 byte each (models/quantization.py)."""
    per_layer = sum(i * o for i, o in map(config.linear_shape, PROJECTIONS))
    if config.moe is not None:  # every expert of every sparse layer
        per_layer, layers = moe_weight_numel(config), 1
    else:
        layers = config.num_hidden_layers
    embed = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    return per_layer * layers * (1 if fp8 else itemsize) + embed * itemsize


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """The slot count a run uses and why, as the summary and the stats JSON (`"slots"`) show it."""

    max_loras: int
    reason: str
    host_cache: str = ""  # the host cache's size and why (engine/host_budget.py), when the run sized it

    def to_dict(self) -> dict:
        d = {"max_loras": self.max_loras, "reason": self.reason}
        if self.host_cache:
            d["host_cache"] = self.host_cache
        return d


@dataclass(frozen=True, slots=True)
class SlotInputs:
    """What the rule reads. spare: GPU bytes beside the weights (None: the run is on CPU); kv_token: KV bytes of
    one token (all layers); context: tokens per sequence the reserve holds (already capped)."""

    adapters: int  # distinct adapters the run may name (pre-flight's good ones)
    one_slot: int  # slot_bytes(...)
    spare: int | None
    max_num_seqs: int = 256
    context: int = KV_RESERVE_CONTEXT
    kv_token: int = 0
    kv_cap: int | None = None  # KV bytes the run can ever use (None: unbounded, the KV takes what is left)

    @property
    def kv_reserve(self) -> int:
        return self.max_num_seqs * self.context * self.kv_token


def choose_max_loras(x: SlotInputs, given: int | None = None) -> SlotChoice:
    """The rule in the module docstring; `given` (--max-loras) wins."""
    n = max(1, x.adapters)
    if given is not None:
        return SlotChoice(given, f"--max-loras {given}")
    if x.spare is None:
        k = min(n, CPU_MAX_LORAS)
        return SlotChoice(k, f"CPU default: min({x.adapters} adapters, {CPU_MAX_LORAS})")
    spare = max(x.spare, 0)
    left = max(spare - x.kv_reserve, 0)
    budget = max(SLOT_SHARE * left, FLOOR_SHARE * spare)
    fit = int(budget // max(x.one_slot, 1))
    idle = ""
    if x.kv_cap is not None:
        from multilora_cli.engine.runner_sizing import staging_buffers

        rest = (1 - KV_CAP_HEADROOM) * spare - x.kv_cap - staging_buffers(x.one_slot) * x.one_slot
        if rest > budget:
            fit = int(rest // max(x.one_slot, 1))
            idle = f"; all of {_gb(rest)} past the {_gb(x.kv_cap)} of KV the input can use and the staging buffers"
    k = max(1, min(n, fit))
    why = "every adapter has one" if k == n and fit >= n else f"{fit} fit"
    return SlotChoice(
        k,
        f"{why}: {x.adapters} adapters, slots of {_gb(x.one_slot)} within "
        f"max({SLOT_SHARE:.0%} of {_gb(left)} left after the base and a KV reserve of {_gb(x.kv_reserve)} "
        f"({x.max_num_seqs} seqs x {x.context} tokens), {FLOOR_SHARE:.0%} of {_gb(spare)} beside the base){idle}",
    )


def reserve_context(max_model_len: int | None, model_max: int) -> int:
    """Tokens per sequence the KV reserve holds: max_model_len (else the model's), at most KV_RESERVE_CONTEXT."""
    return max(1, min(max_model_len or model_max, KV_RESERVE_CONTEXT))


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def spare_gpu_bytes(
    device: str, config: ModelConfig, itemsize: int, utilization: float, fp8: bool = False
) -> int | None:
    """GPU bytes the engine may use (total x `utilization`) less the base weights, on the GPU a run on `device`
    ("auto" | "cuda" | "cpu", engine/device.resolve_device) would use; None when it runs on CPU."""
    import torch

    from multilora_cli.engine.device import resolve_device

    if resolve_device(device) == "cpu":
        return None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return int(total * utilization) - weight_bytes(config, itemsize, fp8)
