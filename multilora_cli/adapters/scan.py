"""`scan_adapter`: a PEFT LoRA checkpoint validated from its config and tensor header alone, no tensor read.

It is every check `load_adapter` makes except NaN/Inf (which needs the values), in that order: config unreadable
or invalid; features multilora cannot serve (from the config, then from the tensor keys); broken weights file; a
lora_A without its lora_B (or the reverse); inconsistent shapes or ranks; a dtype that is not floating point;
and, given a `ModelConfig`, layers or in/out features that do not fit the base model. Both readers build on it:
`load_adapter` (tensors, per module) and `engine/direct_read.read_packed` (the file's bytes straight into a
packed host buffer), so both accept and refuse exactly the same checkpoints with the same messages. One module's
pair checks and the fit against the base are in adapters/module_spec.py.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.adapters.experts import check_dense_on_sparse, expert_key, expert_specs, shared_key
from multilora_cli.adapters.module_spec import ModuleSpec, check_fits, scan_pair
from multilora_cli.adapters.tensors import TensorFile, all_finite, classify_key, weights_file
from multilora_cli.adapters.vocab import VocabScan, check_vocab, vocab_key
from multilora_cli.errors import AdapterError, UnsupportedAdapterError
from multilora_cli.models.config import CHECKPOINT_FUSED, ModelConfig


@dataclass(slots=True)
class AdapterScan:
    """A checkpoint that passed every check but NaN/Inf. `modules` keyed (layer, PEFT module), sorted."""

    name: str
    path: Path
    config: AdapterConfig
    weights_path: Path
    tensors: TensorFile
    modules: dict[tuple[int, str], ModuleSpec]
    module_names: dict[tuple[int, str], str] = field(default_factory=dict)  # full PEFT module names
    stored_dtype: torch.dtype | None = None
    stored_nbytes: int = 0
    ident: tuple | None = None  # `file_ident` of the config and weights, taken before they were read
    expert_keys: list[str] = field(default_factory=list)  # MoE expert LoRA (adapters/experts.py), read at load
    expert_rank: int = 0  # largest rank of the expert LoRA (checked against a MoE base's shapes)
    expert_specs: dict = field(default_factory=dict)  # {(layer, part): adapters/experts.ExpertSpec}, from the header
    vocab: VocabScan = field(default_factory=VocabScan)  # embed_tokens / lm_head LoRA and copies (adapters/vocab.py)

    @property
    def max_rank(self) -> int:
        return max([m.rank for m in self.modules.values()] + [self.expert_rank, self.vocab.max_rank])

    @property
    def base_model(self) -> str | None:
        return self.config.base_model_name_or_path


def scan_adapter(path: Path, name: str, model_config: ModelConfig | None = None) -> AdapterScan:
    """Validate the PEFT LoRA adapter in folder `path` (named `name` in messages) without reading its tensors.
    Raises AdapterError / UnsupportedAdapterError."""
    path = Path(path)
    config_ident = file_ident(path / "adapter_config.json")  # before the read: a later change shows as a mismatch
    config = AdapterConfig.from_dir(path)
    features = config.unsupported()
    if features:
        raise unsupported(name, path / "adapter_config.json", features)
    wfile = weights_file(path, name)
    weights_ident = file_ident(wfile)
    tf = TensorFile(wfile, name)

    # Sort keys: LoRA pairs by (layer, module), everything else is a feature we cannot serve.
    pairs: dict[tuple[int, str], dict[str, str]] = {}
    full_names: dict[tuple[int, str], str] = {}
    features, experts = [], []
    vocab: dict[str, dict[str, str]] = {}  # embed_tokens / lm_head: {"A" | "B" | "full" | "base": key}
    for key in tf.keys():
        vk = vocab_key(key)
        if vk is not None:
            vocab.setdefault(vk[1], {})[vk[2]] = key
            continue
        moe = expert_key(key)
        if moe is True:
            experts.append(key)
            continue
        kind = shared_key(key) or moe or classify_key(key)
        if isinstance(kind, str):
            if kind == "trained biases" and config.bias != "none":  # say which setting saved them
                kind = f"trained biases (bias={config.bias!r})"
            if kind not in features:
                features.append(kind)
            continue
        full, layer, module, ab = kind
        pairs.setdefault((layer, module), {})[ab] = key
        full_names[(layer, module)] = full
    if features:
        raise unsupported(name, wfile, features)
    if not pairs and not experts and not any(set(k) - {"base"} for k in vocab.values()):
        raise AdapterError(f"adapter {name!r}: {wfile} holds no LoRA tensors", hint="re-save the adapter with PEFT")

    ident = (config_ident, weights_ident) if config_ident and weights_ident else None
    scan = AdapterScan(
        name=name,
        path=path,
        config=config,
        weights_path=wfile,
        tensors=tf,
        modules={},
        module_names=full_names,
        ident=ident,
        expert_keys=experts,
    )
    vocab_size, hidden = (model_config.vocab_size, model_config.hidden_size) if model_config else (None, None)
    scan.vocab = check_vocab(name, str(wfile), tf, vocab, config, vocab_size, hidden)
    for key in [k for kinds in vocab.values() for kind, k in kinds.items() if kind in ("A", "B", "full")]:
        scan.stored_nbytes += math.prod(tf.shape(key)) * tf.dtype(key).itemsize
        scan.stored_dtype = scan.stored_dtype or tf.dtype(key)
    for key in experts:  # expert LoRA counts in the stored bytes like any pair (its shapes: adapters/experts.py)
        dt = tf.dtype(key)
        if not dt.is_floating_point:
            raise AdapterError(f"adapter {name!r}: {wfile}: {key} has dtype {dt}; LoRA weights must be floating point")
        scan.stored_nbytes += math.prod(tf.shape(key)) * dt.itemsize
        scan.stored_dtype = scan.stored_dtype or dt
    for (layer, module), keys in sorted(pairs.items()):
        full = full_names[(layer, module)]
        spec, nbytes, dtype = scan_pair(f"adapter {name!r}: {wfile}: {full}", full, keys, tf, config)
        scan.stored_nbytes += nbytes
        scan.stored_dtype = scan.stored_dtype or dtype
        scan.modules[(layer, module)] = spec
    if model_config is not None:
        check_fits(
            name,
            config.base_model_name_or_path,
            {k: (m.in_features, m.out_features) for k, m in scan.modules.items()},
            full_names,
            model_config,
        )
        split_fused(scan, model_config)
        if model_config.moe is not None or experts:
            check_dense_on_sparse(scan.modules, scan.module_names, model_config, name)
            scan.expert_specs = expert_specs(tf, experts, config, model_config, name) if experts else {}
            scan.expert_rank = max((s.rank for s in scan.expert_specs.values()), default=0)
    return scan


def split_fused(scan: AdapterScan, model_config: ModelConfig) -> None:
    """Replace each fused checkpoint module (layer, "qkv_proj" | "gate_up_proj") of `scan` by its slices (layer,
    "q_proj") ... as the engine packs them: the shared lora_A and each slice's rows of lora_B (`ModuleSpec.b_rows`).
    The slices keep the fused module's full PEFT name (messages name what the file holds)."""
    for (layer, module), spec in list(scan.modules.items()):
        if module not in CHECKPOINT_FUSED:
            continue
        del scan.modules[(layer, module)]
        full = scan.module_names.pop((layer, module))
        lo = 0
        for piece, rows in model_config.checkpoint_slices(module):
            scan.modules[(layer, piece)] = replace(spec, out_features=rows, b_rows=(lo, lo + rows))
            scan.module_names[(layer, piece)] = full
            lo += rows
    scan.modules = dict(sorted(scan.modules.items()))


def read_magnitudes(scan: AdapterScan) -> dict[tuple[int, str], torch.Tensor]:
    """DoRA: (layer, PEFT module) -> its magnitude m [out] in float32 (a fused module's slice: its rows), read from
    the file; {} for a plain LoRA. Raises the NaN/Inf error `load_adapter` raises for A / B."""
    out, read = {}, {}
    for key, spec in scan.modules.items():
        if spec.key_m is None:
            continue
        if spec.key_m not in read:
            read[spec.key_m] = scan.tensors.get(spec.key_m).float()
        m = read[spec.key_m]
        if spec.b_rows is not None:
            m = m[spec.b_rows[0] : spec.b_rows[1]]
        if not all_finite(m):
            raise nonfinite(scan.name, scan.weights_path, scan.module_names[key], "magnitude_vector")
        out[key] = m
    return out


def file_ident(file: Path) -> tuple | None:
    """(size, mtime, inode) of `file`, None if it cannot be stat'ed: equal idents = the same bytes, for reuse."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def scan_ident(scan: AdapterScan) -> tuple | None:
    """The adapter's files' identity now, comparable with `scan.ident` (None if either is gone)."""
    a, b = file_ident(scan.path / "adapter_config.json"), file_ident(scan.weights_path)
    return (a, b) if a and b else None


def nonfinite(name: str, file: Path, full: str, ab: str) -> AdapterError:
    """The error for a lora_A / lora_B (`ab`) holding NaN or Inf, whichever reader found it."""
    return AdapterError(
        f"adapter {name!r}: {file}: {full}: lora_{ab} contains NaN or Inf values",
        hint="the adapter is broken (diverged training?); use another checkpoint",
    )


def unsupported(name: str, file: Path, features: list[str]) -> UnsupportedAdapterError:
    listed = "; ".join(features)
    return UnsupportedAdapterError(
        f"adapter {name!r} ({file}) uses {listed}, which multilora cannot serve yet",
        hint="merge it into the base model with PEFT merge_and_unload, or re-train a plain LoRA "
        "on q/k/v/o/gate/up/down projections",
    )
