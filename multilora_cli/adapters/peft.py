"""Load a PEFT LoRA checkpoint into per-(layer, module) A, B and scaling, validated before any GPU work.

`load_adapter` raises on the first problem, in this order: config unreadable or invalid; features multilora
cannot serve (from the config, then from the tensor keys); broken weights file; a lora_A without its
lora_B (or the reverse); inconsistent shapes or ranks; given a `ModelConfig`, layers or in/out features that do
not fit the base model (all of these from the header: adapters/scan.py); then NaN/Inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.adapters.experts import load_experts
from multilora_cli.adapters.scan import all_finite, nonfinite, read_magnitudes, scan_adapter
from multilora_cli.adapters.tensors import to_dtype
from multilora_cli.adapters.vocab import VocabScan, VocabWeights
from multilora_cli.errors import AdapterError
from multilora_cli.models.config import FUSED, FUSED_MODULES, ModelConfig
from multilora_cli.models.moe_config import SHARED_FUSED

# fused module -> PEFT names of its slices, in slice order: qkv_proj -> [q_proj, k_proj, v_proj]
SLICES = {
    f: [n for n, _ in sorted(((n, i) for n, (g, i) in FUSED.items() if g == f), key=lambda t: t[1])]
    for f in FUSED_MODULES
} | SHARED_FUSED


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
    """A validated LoRA adapter. `modules` is keyed by (layer index, PEFT module name, e.g. "q_proj"); a fused
    checkpoint module (Phi-3's qkv_proj, gate_up_proj) appears as its slices (q_proj, k_proj, v_proj), each with
    the module's lora_A and its rows of lora_B (adapters/scan.py `split_fused`), so `num_params` counts such an A
    once per slice, as the slots hold it."""

    name: str
    path: Path
    config: AdapterConfig
    modules: dict[tuple[int, str], LoraModule]
    base_model: str | None
    weights_path: Path
    stored_dtype: torch.dtype
    stored_nbytes: int
    module_names: dict[tuple[int, str], str] = field(default_factory=dict)  # full PEFT module names
    # DoRA (use_dora): (layer, PEFT module) -> magnitude m [out] float32; {} for a plain LoRA. The slot loader turns
    # it into m / ||W + s·B·A|| per output feature (engine/dora.py)
    magnitudes: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)

    @property
    def is_dora(self) -> bool:
        return bool(self.magnitudes)

    # MoE expert LoRA: {(layer, "gate" | "up" | "down"): (A [E, r, in], B [E, out, r], scaling)} (adapters/experts.py)
    experts: dict[tuple[int, str], tuple] = field(default_factory=dict)
    # LoRA on embed_tokens / lm_head and modules_to_save copies of them (adapters/vocab.py); None: none
    vocab: VocabWeights | None = None

    def _ranks(self) -> list[int]:
        ranks = [m.rank for m in self.modules.values()] + [a.shape[1] for a, _, _ in self.experts.values()]
        return ranks + ([self.vocab.max_rank] if self.vocab is not None and self.vocab.max_rank else [])

    @property
    def max_rank(self) -> int:
        return max(self._ranks(), default=0)

    @property
    def min_rank(self) -> int:
        return min(self._ranks(), default=0)

    @property
    def num_params(self) -> int:
        dense = sum(m.a.numel() + m.b.numel() for m in self.modules.values())
        vocab = self.vocab.num_params if self.vocab is not None else 0
        return dense + vocab + sum(a.numel() + b.numel() for a, b, _ in self.experts.values())

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


def load_adapter(
    path: Path, name: str, model_config: ModelConfig | None = None, *, dtype: torch.dtype | None = None
) -> LoraAdapter:
    """Read and validate the PEFT LoRA adapter in folder `path` (named `name` in messages).

    With `model_config`, layers and in/out features are checked against the base model. `dtype` converts the
    tensors (the stored dtype and bytes stay reported as stored). Raises AdapterError / UnsupportedAdapterError:
    every check of `adapters/scan.scan_adapter` first (from the config and header), then NaN/Inf.
    """
    scan = scan_adapter(path, name, model_config)
    tf, modules, read = scan.tensors, {}, {}
    for (layer, module), spec in scan.modules.items():
        for key in (spec.key_a, spec.key_b):  # a fused module's slices share its tensors: read each once
            if key not in read:
                read[key] = tf.get(key)
        a, b = read[spec.key_a], read[spec.key_b]
        if spec.b_rows is not None:
            b = b[spec.b_rows[0] : spec.b_rows[1]]
        for t, ab in ((a, "A"), (b, "B")):
            if not all_finite(t):
                raise nonfinite(name, scan.weights_path, scan.module_names[(layer, module)], ab)
        if dtype is not None:
            where = f"adapter {name!r}: {scan.weights_path}: {scan.module_names[(layer, module)]}: lora_"
            a, b = to_dtype(a, dtype, where + "A"), to_dtype(b, dtype, where + "B")
        modules[(layer, module)] = LoraModule(a=a, b=b, scaling=spec.scaling)
    experts = (
        load_experts(tf, scan.expert_keys, scan.config, model_config, name, scan.expert_specs)
        if scan.expert_keys
        else {}
    )
    if dtype is not None:
        for (layer, part), (a, b, sc) in experts.items():
            where = f"adapter {name!r}: {scan.weights_path}: expert LoRA of layer {layer}"
            experts[(layer, part)] = (to_dtype(a, dtype, where), to_dtype(b, dtype, where), sc)
    return LoraAdapter(
        experts=experts,
        name=name,
        path=scan.path,
        config=scan.config,
        modules=modules,
        base_model=scan.config.base_model_name_or_path,
        weights_path=scan.weights_path,
        stored_dtype=scan.stored_dtype,
        stored_nbytes=scan.stored_nbytes,
        module_names=scan.module_names,
        magnitudes=read_magnitudes(scan),
        vocab=read_vocab(tf, scan.vocab, dtype, name, scan.weights_path),
    )


def read_vocab(tf, scan: VocabScan, dtype: torch.dtype | None, name: str, file) -> VocabWeights | None:
    """Read the tensors `scan` names from `tf` (converted to `dtype`), None when there are none. NaN / Inf is
    refused as for any LoRA tensor."""
    if not scan:
        return None

    def get(key: str) -> torch.Tensor:
        t = tf.get(key)
        if not all_finite(t):
            raise AdapterError(
                f"adapter {name!r}: {file}: {key} contains NaN or Inf values",
                hint="the adapter is broken (diverged training?); use another checkpoint",
            )
        return t if dtype is None else to_dtype(t, dtype, f"adapter {name!r}: {file}: {key}")

    out = VocabWeights()
    for module, spec in scan.lora.items():
        mod = LoraModule(a=get(spec.key_a), b=get(spec.key_b), scaling=spec.scaling)
        if module == "embed_tokens":
            out.embed = mod
        else:
            out.head = mod
    out.embed_full = get(scan.full["embed_tokens"]) if "embed_tokens" in scan.full else None
    out.head_full = get(scan.full["lm_head"]) if "lm_head" in scan.full else None
    out.base_copies = {m: (lambda k=k: tf.get(k)) for m, k in scan.base.items()}
    return out
