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
from multilora_cli.adapters.report_rows import ExtraCost, ModuleRow, expert_rows, extra_costs, lora_rows, vocab_rows
from multilora_cli.adapters.resolve import resolve
from multilora_cli.errors import AdapterError, MultiloraError, UnsupportedModelError
from multilora_cli.models.config import CHECKPOINT_MODULES, ModelConfig


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

    rows = lora_rows(adapter, config) + expert_rows(adapter, config) + vocab_rows(adapter, config)
    num_params = sum(r.params for r in rows)
    extras = extra_costs(adapter, model_config)
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
