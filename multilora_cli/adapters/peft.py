"""Load a PEFT LoRA checkpoint into per-(layer, module) A, B and scaling, validated before any GPU work.

`load_adapter` raises on the first problem, in this order: config unreadable or invalid; features multilora
cannot serve (from the config, then from the tensor keys); broken weights file; a lora_A without its
lora_B (or the reverse); inconsistent shapes or ranks; NaN/Inf; and, given a `ModelConfig`, layers or
in/out features that do not fit the base model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.adapters.tensors import TensorFile, classify_key, weights_file
from multilora_cli.errors import AdapterError, UnsupportedAdapterError
from multilora_cli.models.config import FUSED, FUSED_MODULES, ModelConfig

# fused module -> PEFT names of its slices, in slice order: qkv_proj -> [q_proj, k_proj, v_proj]
SLICES = {f: [n for n, _ in sorted(((n, i) for n, (g, i) in FUSED.items() if g == f), key=lambda t: t[1])]
          for f in FUSED_MODULES}


@dataclass(slots=True)
class LoraModule:
    """One adapted linear layer: a: [r, in] (lora_A), b: [out, r] (lora_B); delta W = scaling * b @ a."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(slots=True)
class LoraAdapter:
    """A validated LoRA adapter. `modules` is keyed by (layer index, PEFT module name, e.g. "q_proj")."""

    name: str
    path: Path
    config: AdapterConfig
    modules: dict[tuple[int, str], LoraModule]
    base_model: str | None
    weights_path: Path
    stored_dtype: torch.dtype
    stored_nbytes: int
    module_names: dict[tuple[int, str], str] = field(default_factory=dict)  # full PEFT module names

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules.values())

    @property
    def min_rank(self) -> int:
        return min(m.rank for m in self.modules.values())

    @property
    def num_params(self) -> int:
        return sum(m.a.numel() + m.b.numel() for m in self.modules.values())

    @property
    def nbytes(self) -> int:
        """Bytes of the LoRA tensors as stored in the checkpoint."""
        return self.stored_nbytes

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the tensors as stored in the checkpoint."""
        return self.stored_dtype

    @property
    def layers(self) -> list[int]:
        return sorted({layer for layer, _ in self.modules})

    def slices_for(self, layer: int, fused: str) -> list[tuple[torch.Tensor, torch.Tensor, float] | None]:
        """(A [r, in], B [out_slice, r], scaling) per slice of our fused module, None where not adapted."""
        out = []
        for peft_name in SLICES[fused]:
            m = self.modules.get((layer, peft_name))
            out.append(None if m is None else (m.a, m.b, m.scaling))
        return out


def load_adapter(path: Path, name: str, model_config: ModelConfig | None = None, *,
                 dtype: torch.dtype | None = None) -> LoraAdapter:
    """Read and validate the PEFT LoRA adapter in folder `path` (named `name` in messages).

    With `model_config`, layers and in/out features are checked against the base model. `dtype` converts the
    tensors (the stored dtype and bytes stay reported as stored). Raises AdapterError / UnsupportedAdapterError.
    """
    path = Path(path)
    config = AdapterConfig.from_dir(path)
    features = config.unsupported()
    if features:
        raise _unsupported(name, path / "adapter_config.json", features)
    wfile = weights_file(path, name)
    tf = TensorFile(wfile, name)

    # Sort keys: LoRA pairs by (layer, module), everything else is a feature we cannot serve.
    pairs: dict[tuple[int, str], dict[str, str]] = {}
    full_names: dict[tuple[int, str], str] = {}
    features = []
    for key in tf.keys():
        kind = classify_key(key)
        if isinstance(kind, str):
            if kind not in features:
                features.append(kind)
            continue
        full, layer, module, ab = kind
        pairs.setdefault((layer, module), {})[ab] = key
        full_names[(layer, module)] = full
    if features:
        raise _unsupported(name, wfile, features)
    if not pairs:
        raise AdapterError(f"adapter {name!r}: {wfile} holds no LoRA tensors", hint="re-save the adapter with PEFT")

    modules: dict[tuple[int, str], LoraModule] = {}
    stored_nbytes, stored_dtype = 0, None
    for (layer, module), keys in sorted(pairs.items()):
        full = full_names[(layer, module)]
        where = f"adapter {name!r}: {wfile}: {full}"
        for ab in ("A", "B"):
            if ab not in keys:
                have = "lora_B" if ab == "A" else "lora_A"
                raise AdapterError(f"{where} has {have} but no lora_{ab}",
                                   hint="the checkpoint is incomplete; re-save or re-download it")
        if not config.target_matches(full):
            raise AdapterError(f"{where} has LoRA tensors but adapter_config.json target_modules does not select it "
                               "(PEFT would ignore them)", hint="fix target_modules or re-save the adapter with PEFT")
        a, b = tf.get(keys["A"]), tf.get(keys["B"])
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not a [r, in] / "
                               "[out, r] pair", hint="the checkpoint is corrupt; re-save it")
        r = a.shape[0]
        if r == 0:
            raise AdapterError(f"{where} has rank 0", hint="re-train or re-save the adapter with r >= 1")
        want = config.rank_for(full)
        if r != want:
            raise AdapterError(f"{where} has rank {r} but adapter_config.json gives it r={want} "
                               "(r / rank_pattern)", hint="fix adapter_config.json so PEFT and multilora agree")
        for t, ab in ((a, "A"), (b, "B")):
            if not t.is_floating_point():
                raise AdapterError(f"{where}: lora_{ab} has dtype {t.dtype}; LoRA weights must be floating point")
            if not bool(torch.isfinite(t).all()):
                raise AdapterError(f"{where}: lora_{ab} contains NaN or Inf values",
                                   hint="the adapter is broken (diverged training?); use another checkpoint")
            stored_nbytes += t.numel() * t.element_size()
            stored_dtype = stored_dtype or t.dtype
        if dtype is not None:
            a, b = a.to(dtype), b.to(dtype)
        modules[(layer, module)] = LoraModule(a=a, b=b, scaling=config.scaling_for(full, r))

    adapter = LoraAdapter(name=name, path=path, config=config, modules=modules,
                          base_model=config.base_model_name_or_path, weights_path=wfile,
                          stored_dtype=stored_dtype, stored_nbytes=stored_nbytes, module_names=full_names)
    if model_config is not None:
        check_fits(adapter, model_config)
    return adapter


def check_fits(adapter: LoraAdapter, model_config: ModelConfig) -> None:
    """Raise AdapterError if `adapter` has a layer or an in/out feature count the base model lacks."""
    base = model_config.name_or_path or "the base model"
    trained = f" (it was trained on {adapter.base_model!r})" if adapter.base_model else ""
    head = f"adapter {adapter.name!r} does not fit base model {base!r}{trained}"
    hint = "pass the base model the adapter was trained on with --model, or use an adapter made for this base"
    n_layers = model_config.num_hidden_layers
    for (layer, module), m in sorted(adapter.modules.items()):
        full = adapter.module_names.get((layer, module), f"layers.{layer}.{module}")
        if layer >= n_layers:
            raise AdapterError(f"{head}: {full} is layer {layer} but the base has {n_layers} layers (0..{n_layers - 1})",
                               hint=hint)
        want_in, want_out = model_config.linear_shape(module)
        got_in, got_out = m.a.shape[1], m.b.shape[0]
        if (got_in, got_out) != (want_in, want_out):
            raise AdapterError(f"{head}: {full} maps {got_in} -> {got_out} features, the base's {module} maps "
                               f"{want_in} -> {want_out}", hint=hint)


def _unsupported(name: str, file: Path, features: list[str]) -> UnsupportedAdapterError:
    listed = "; ".join(features)
    return UnsupportedAdapterError(
        f"adapter {name!r} ({file}) uses {listed}, which multilora cannot serve yet",
        hint="merge it into the base model with PEFT merge_and_unload, or re-train a plain LoRA "
             "on q/k/v/o/gate/up/down projections",
    )
