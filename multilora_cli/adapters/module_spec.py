"""One adapted module of a PEFT checkpoint as its header describes it (`ModuleSpec`), checked pair by pair
(`scan_pair`) and, given a base model, against the base's layers and features (`check_fits`). adapters/scan.py
runs these over the whole header."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.adapters.tensors import TensorFile
from multilora_cli.errors import AdapterError
from multilora_cli.models.config import ModelConfig


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    """One adapted linear layer as the header describes it: lora_A [rank, in], lora_B [out, rank].

    A slice of a fused checkpoint module (Phi-3's qkv_proj -> q/k/v, gate_up_proj -> gate/up) is the module's own
    lora_A (shared by its slices: each slot slice gets a copy, which is exact) and rows `b_rows` = [lo, hi) of its
    lora_B; `out_features` is then hi - lo. None = the whole lora_B."""

    key_a: str
    key_b: str
    rank: int
    in_features: int
    out_features: int
    scaling: float
    dtype_a: torch.dtype
    dtype_b: torch.dtype
    b_rows: tuple[int, int] | None = None
    key_m: str | None = None  # DoRA: lora_magnitude_vector [out] (a fused module's slice: its rows b_rows)


def scan_pair(
    where: str, full: str, keys: dict[str, str], tf: TensorFile, config: AdapterConfig
) -> tuple[ModuleSpec, int, torch.dtype]:
    """One module's LoRA tensors (keys: "A", "B" and DoRA's "M" -> tensor key) checked from the header: both of
    the pair, DoRA as the config says, selected by target_modules, [r, in] / [out, r] shapes, the config's rank,
    floating dtypes, a magnitude vector of [out]. Returns (its spec, the bytes it stores, lora_A's dtype); raises
    AdapterError starting with `where` (adapter, file, module)."""
    nbytes, stored = 0, None
    for ab in ("A", "B"):
        if ab not in keys:
            have = "lora_B" if ab == "A" else "lora_A"
            raise AdapterError(
                f"{where} has {have} but no lora_{ab}",
                hint="the checkpoint is incomplete; re-save or re-download it",
            )
    if config.use_dora != ("M" in keys):
        raise AdapterError(
            f"{where}: "
            + (
                "use_dora is set but it has no lora_magnitude_vector"
                if config.use_dora
                else "it has a DoRA lora_magnitude_vector but adapter_config.json has no use_dora"
            ),
            hint="the checkpoint and its adapter_config.json disagree; re-save the adapter with PEFT",
        )
    if not config.target_matches(full):
        raise AdapterError(
            f"{where} has LoRA tensors but adapter_config.json target_modules does not select it "
            "(PEFT would ignore them)",
            hint="fix target_modules or re-save the adapter with PEFT",
        )
    sa, sb = tf.shape(keys["A"]), tf.shape(keys["B"])
    if len(sa) != 2 or len(sb) != 2 or sa[0] != sb[1]:
        raise AdapterError(
            f"{where}: lora_A {tuple(sa)} and lora_B {tuple(sb)} are not a [r, in] / [out, r] pair",
            hint="the checkpoint is corrupt; re-save it",
        )
    r = sa[0]
    if r == 0:
        raise AdapterError(f"{where} has rank 0", hint="re-train or re-save the adapter with r >= 1")
    want = config.rank_for(full)
    if r != want:
        raise AdapterError(
            f"{where} has rank {r} but adapter_config.json gives it r={want} (r / rank_pattern)",
            hint="fix adapter_config.json so PEFT and multilora agree",
        )
    dtypes = tf.dtype(keys["A"]), tf.dtype(keys["B"])
    for dt, ab, shape in ((dtypes[0], "A", sa), (dtypes[1], "B", sb)):
        if not dt.is_floating_point:
            raise AdapterError(f"{where}: lora_{ab} has dtype {dt}; LoRA weights must be floating point")
        nbytes += shape[0] * shape[1] * dt.itemsize
        stored = stored or dt
    key_m = keys.get("M")
    if key_m is not None:
        sm, dm = tf.shape(key_m), tf.dtype(key_m)
        if tuple(sm) != (sb[0],) or not dm.is_floating_point:
            raise AdapterError(
                f"{where}: lora_magnitude_vector {tuple(sm)} {dm} is not a floating [{sb[0]}] vector (one per "
                "output feature)",
                hint="the checkpoint is corrupt; re-save it",
            )
        nbytes += sm[0] * dm.itemsize
    spec = ModuleSpec(keys["A"], keys["B"], r, sa[1], sb[0], config.scaling_for(full, r), *dtypes, key_m=key_m)
    return spec, nbytes, stored


def check_fits(
    name: str,
    base_model: str | None,
    features: dict[tuple[int, str], tuple[int, int]],
    module_names: dict[tuple[int, str], str],
    model_config: ModelConfig,
) -> None:
    """Raise AdapterError if a module (layer, PEFT name) -> (in, out) is a layer or feature count the base lacks."""
    base = model_config.name_or_path or "the base model"
    trained = f" (it was trained on {base_model!r})" if base_model else ""
    head = f"adapter {name!r} does not fit base model {base!r}{trained}"
    hint = "pass the base model the adapter was trained on with --model, or use an adapter made for this base"
    n_layers = model_config.num_hidden_layers
    for (layer, module), (got_in, got_out) in sorted(features.items()):
        full = module_names.get((layer, module), f"layers.{layer}.{module}")
        if layer >= n_layers:
            raise AdapterError(
                f"{head}: {full} is layer {layer} but the base has {n_layers} layers (0..{n_layers - 1})", hint=hint
            )
        if module not in model_config.peft_modules:
            raise AdapterError(
                f"{head}: {full} is a {module}, which the base's layers do not have "
                f"(its {model_config.model_type} layers have {', '.join(model_config.peft_modules)})",
                hint=hint,
            )
        want_in, want_out = model_config.linear_shape(module)
        if (got_in, got_out) != (want_in, want_out):
            raise AdapterError(
                f"{head}: {full} maps {got_in} -> {got_out} features, the base's {module} maps {want_in} -> {want_out}",
                hint=hint,
            )
