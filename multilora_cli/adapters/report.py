"""What `multilora inspect` shows: one adapter's shape, size and whether multilora can serve it.

`build_report` resolves and reads the adapter (and, given a model, checks it against that base). A missing
folder or config raises (nothing to show); an adapter that loads but cannot be served still yields a report
whose verdict says why, with the error kept in `error` for the command to raise after printing. The verdict
agrees with `run`: an adapter whose own base (a folder here, what `run` uses without --model) is of an
architecture or a quantization `run` refuses is not servable, by `ModelConfig.from_dir`'s own check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.adapters.preflight import adapter_base, default_name
from multilora_cli.adapters.resolve import resolve
from multilora_cli.errors import AdapterError, MultiloraError, UnsupportedModelError
from multilora_cli.models.config import CHECKPOINT_MODULES, ModelConfig


@dataclass(slots=True)
class ModuleRow:
    """Modules of one PEFT name sharing rank and alpha; `params` sums A and B over `layers`."""

    module: str
    layers: list[int]
    rank: int
    alpha: float
    scaling: float
    in_features: int
    out_features: int
    params: int


@dataclass(slots=True)
class ExtraCost:
    """A served feature beyond plain LoRA pairs and what it costs: `params` stored in the adapter, `slot_bytes` the
    GPU memory it adds to each slot of a run (None when the base's shapes are unknown)."""

    kind: str  # "dora"
    params: int
    bytes_bf16: int
    slot_bytes: int | None
    note: str


@dataclass(slots=True)
class InspectReport:
    source: str
    path: str
    base_model: str | None
    checked_against: str | None
    check_note: str | None  # why shapes were not checked against the adapter's own base, when it was unreadable
    peft_type: str
    task_type: str | None
    rank: dict  # {"min", "max"}
    alpha: dict
    scaling: dict
    use_rslora: bool
    target_modules: list[str] | str | None
    modules_adapted: list[str]
    layers: list[int]
    num_layers: int | None
    num_params: int | None
    bytes: int | None
    bytes_bf16: int | None
    dtype: str | None
    modules: list[ModuleRow]
    servable: bool
    reason: str | None
    extras: list[ExtraCost] = field(default_factory=list)  # DoRA magnitudes ...: served, at this cost
    error: MultiloraError | None = field(default=None, repr=False)  # AdapterError, or the base's UnsupportedModelError
    base_quantization: str | None = None  # the checked base's FP8 format (models/quantization.py); None: unquantized

    def to_json(self) -> dict:
        """A JSON-ready dict (the error object left out; its message is `reason`)."""
        d = asdict(replace(self, error=None))
        d.pop("error")
        return d


def build_report(spec: str, model: str | None = None) -> InspectReport:
    """Inspect adapter `spec` (path or Hub id); validate shapes against `model`, else against the adapter's own
    base_model_name_or_path when that is a model folder on this machine (no download just to inspect)."""
    from multilora_cli.adapters.peft import load_adapter

    path = resolve(spec, kind="adapter")
    config = AdapterConfig.from_dir(path)
    model_config, note, unservable = None, None, None
    if model is not None:
        hint = f"--model takes a base model; to inspect this adapter: multilora inspect {model}"
        model_config = replace(
            ModelConfig.from_dir(resolve(model, kind="model"), adapter_hint=hint), name_or_path=model
        )
    else:
        base = adapter_base(Path(path), config)
        if base is not None and (Path(base) / "config.json").is_file():
            try:
                model_config = replace(ModelConfig.from_dir(base), name_or_path=base)
                model = base
            except UnsupportedModelError as e:  # `run` would refuse it: the adapter is not servable on its base
                why = e.message.removeprefix(f"{base}: ")
                unservable = UnsupportedModelError(
                    f"adapter {spec!r}: its base model {base} is not servable: {why}", hint=e.hint
                )
                note = "base not servable"
            except MultiloraError as e:  # unreadable, not unservable: report the adapter anyway
                note = f"base unreadable: {e.one_line()}"
    try:
        adapter = load_adapter(path, default_name(spec), model_config)
    except AdapterError as e:
        return _from_config(spec, path, config, model, note, e)

    # modules as the checkpoint holds them: the slices of a fused module (Phi-3's qkv_proj, split for the slots)
    # are one module again, with one lora_A and all rows of lora_B
    held: dict[tuple[int, str], tuple[object, int, str]] = {}  # (layer, module) -> (a LoraModule, out rows, name)
    for key, m in adapter.modules.items():
        full = adapter.module_names[key]
        leaf = full.rsplit(".", 1)[-1]
        leaf = f"shared_expert.{leaf}" if full.endswith(f".shared_expert.{leaf}") else leaf  # Qwen2-MoE
        first, rows, _ = held.get((key[0], leaf), (m, 0, full))
        held[(key[0], leaf)] = (first, rows + m.b.shape[0], full)
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for (layer, module), (m, out, full) in held.items():
        order = CHECKPOINT_MODULES.index(module) if module in CHECKPOINT_MODULES else len(CHECKPOINT_MODULES)
        key = (order, module, m.rank, config.alpha_for(full), m.scaling, m.a.shape[1], out)
        groups.setdefault(key, []).append((layer, m.rank * (m.a.shape[1] + out)))
    rows = [
        ModuleRow(
            module=k[1],
            layers=sorted(layer for layer, _ in ms),
            rank=k[2],
            alpha=k[3],
            scaling=k[4],
            in_features=k[5],
            out_features=k[6],
            params=sum(p for _, p in ms),
        )
        for k, ms in sorted(groups.items(), key=lambda kv: (kv[0][0], min(layer for layer, _ in kv[1])))
    ]
    rows += _expert_rows(adapter, config)
    rows += _vocab_rows(adapter, config)
    num_params = sum(r.params for r in rows)
    extras = _extras(adapter, model_config)
    alphas = [r.alpha for r in rows] or [config.lora_alpha]  # (a modules_to_save-only adapter has no rows)
    scalings = [r.scaling for r in rows] or [0.0]
    return InspectReport(
        source=spec,
        path=str(path),
        base_model=config.base_model_name_or_path,
        checked_against=model,
        check_note=note,
        peft_type=config.peft_type,
        task_type=config.task_type,
        rank={"min": adapter.min_rank, "max": adapter.max_rank},
        alpha={"min": min(alphas), "max": max(alphas)},
        scaling={"min": min(scalings), "max": max(scalings)},
        use_rslora=config.use_rslora,
        target_modules=config.target_modules,
        modules_adapted=[m for m in CHECKPOINT_MODULES if any(r.module == m for r in rows)]
        + sorted({r.module for r in rows if r.module.startswith(("experts.", "shared_expert."))})
        + [m for m in ("embed_tokens", "lm_head") if any(r.module == m for r in rows)],
        layers=sorted(set(adapter.layers) | {layer for layer, _ in adapter.experts}),
        num_layers=model_config.num_hidden_layers if model_config else None,
        num_params=num_params,
        bytes=adapter.nbytes,
        bytes_bf16=2 * (num_params + sum(e.params for e in extras)),
        dtype=str(adapter.dtype).removeprefix("torch."),
        modules=rows,
        extras=extras,
        servable=unservable is None,
        reason=None if unservable is None else unservable.one_line(),
        error=unservable,
        base_quantization=model_config.quantization.describe() if model_config and model_config.quantization else None,
    )


def _extras(adapter, model_config: ModelConfig | None) -> list[ExtraCost]:
    """What the adapter holds beyond LoRA pairs, and its cost (engine/dora.py, engine/slot_budget.py)."""
    from multilora_cli.adapters.costs import dora_slot_bytes, full_copy_bytes, vocab_lora_slot_bytes

    out = []
    vocab = adapter.vocab
    for module, m in (("embed_tokens", vocab.embed), ("lm_head", vocab.head)) if vocab is not None else ():
        if m is not None:  # its A / B are module rows; the run's slots are vocabulary-sized
            out.append(
                ExtraCost(
                    kind=f"{module}_lora",
                    params=0,
                    bytes_bf16=0,
                    slot_bytes=vocab_lora_slot_bytes(model_config, module, m.rank) if model_config else None,
                    note=f"LoRA on {module}: vocabulary-sized slots in every GPU slot of the run (here at its rank "
                    f"{m.rank}; the run's --max-lora-rank sizes them)",
                )
            )
    for module, t in (("embed_tokens", vocab.embed_full), ("lm_head", vocab.head_full)) if vocab is not None else ():
        if t is not None:
            out.append(
                ExtraCost(
                    kind=f"{module}_modules_to_save",
                    params=t.numel(),
                    bytes_bf16=2 * t.numel(),
                    slot_bytes=full_copy_bytes(model_config, 2) if model_config else None,
                    note=f"modules_to_save: a full trained {module} [{t.shape[0]}, {t.shape[1]}], one copy on the GPU "
                    "per slot this adapter holds",
                )
            )
    if adapter.magnitudes:
        # a fused checkpoint module's slices share its vector: count each stored value once, by its rows
        n = sum(m.numel() for m in adapter.magnitudes.values())
        out.append(
            ExtraCost(
                kind="dora",
                params=n,
                bytes_bf16=2 * n,
                slot_bytes=dora_slot_bytes(model_config) if model_config is not None else None,
                note="DoRA: magnitude vectors; m / ||W + s·B·A|| computed once per slot load, applied per row",
            )
        )
    return out


def _vocab_rows(adapter, config: AdapterConfig) -> list[ModuleRow]:
    """LoRA on embed_tokens / lm_head (adapters/vocab.py) as module rows without layers: embed_tokens maps V -> H
    (its A is [r, V]), lm_head H -> V."""
    vocab, rows = adapter.vocab, []
    for module, m in (("embed_tokens", vocab.embed), ("lm_head", vocab.head)) if vocab is not None else ():
        if m is None:
            continue
        fin, fout = m.a.shape[1], m.b.shape[0]
        alpha = m.scaling * (m.rank**0.5 if config.use_rslora else m.rank)
        rows.append(ModuleRow(module, [], m.rank, alpha, m.scaling, fin, fout, m.rank * (fin + fout)))
    return rows


def _expert_rows(adapter, config: AdapterConfig) -> list[ModuleRow]:
    """MoE expert LoRA (adapters/experts.py) as rows "experts.gate" / "experts.up" / "experts.down": rank per expert,
    params over all E experts as the slots hold them (PEFT's gate_up_proj A counted for gate and for up)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for (layer, part), (a, b, scaling) in adapter.experts.items():
        key = (("gate", "up", "down").index(part), f"experts.{part}", a.shape[1], scaling, a.shape[2], b.shape[1])
        groups.setdefault(key, []).append((layer, a.numel() + b.numel()))
    return [
        ModuleRow(
            module=k[1],
            layers=sorted(layer for layer, _ in ms),
            rank=k[2],
            alpha=k[3] * (k[2] ** 0.5 if config.use_rslora else k[2]),
            scaling=k[3],
            in_features=k[4],
            out_features=k[5],
            params=sum(p for _, p in ms),
        )
        for k, ms in sorted(groups.items())
    ]


def _from_config(
    spec: str, path: Path, config: AdapterConfig, model: str | None, note: str | None, error: AdapterError
) -> InspectReport:
    """The report of an adapter that cannot be served: ranks, alphas and scalings of the LoRA pairs its header
    names (as PEFT would set them), else what the config alone says; no per-module table or size."""
    ranks, alphas, scalings = _header_figures(path, config)
    if not ranks:  # no readable header: r and the patterns, which may name ranks no module has
        ranks = [config.r, *config.rank_pattern.values()]
        alphas = [config.lora_alpha, *config.alpha_pattern.values()]
        # without patterns the scaling is one number; with them, which (r, alpha) pairs occur needs the tensors
        scalings = [config.scaling_for("", config.r)] if not (config.rank_pattern or config.alpha_pattern) else []

    def span(xs: list) -> dict:
        return {"min": min(xs), "max": max(xs)} if xs else {"min": None, "max": None}

    return InspectReport(
        source=spec,
        path=str(path),
        base_model=config.base_model_name_or_path,
        checked_against=model,
        check_note=note,
        peft_type=config.peft_type,
        task_type=config.task_type,
        rank=span(ranks),
        alpha=span(alphas),
        scaling=span(scalings),
        use_rslora=config.use_rslora,
        target_modules=config.target_modules,
        modules_adapted=[],
        layers=[],
        num_layers=None,
        num_params=None,
        bytes=None,
        bytes_bf16=None,
        dtype=None,
        modules=[],
        servable=False,
        reason=" ".join(error.message.split()),
        error=error,
    )


def _header_figures(path: Path, config: AdapterConfig) -> tuple[list[int], list[float], list[float]]:
    """(ranks, alphas, scalings) of the lora_A tensors in the weights file's header (lora_A: [r, in]); empty
    lists when there is no readable file or no such tensor. DoRA, bias or modules_to_save extras are skipped."""
    from multilora_cli.adapters.tensors import TensorFile, classify_key, weights_file

    try:
        tf = TensorFile(weights_file(path, path.name), path.name)
    except AdapterError:
        return [], [], []
    ranks, alphas, scalings = [], [], []
    for key in tf.keys():
        kind = classify_key(key)
        if isinstance(kind, tuple) and kind[3] == "A" and len(tf.shape(key)) == 2 and tf.shape(key)[0] > 0:
            full, r = kind[0], tf.shape(key)[0]
            ranks.append(r)
            alphas.append(config.alpha_for(full))
            scalings.append(config.scaling_for(full, r))
    return ranks, alphas, scalings


def layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out, start, prev = [], None, None
    for i in sorted(layers):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ", ".join(out)
