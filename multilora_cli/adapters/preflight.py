"""Pre-flight for a run: from `--adapters` / `--adapter-dir` / `--model` to validated adapters and pool sizes.

Everything here happens before any GPU work, so a bad adapter costs seconds, not a model load. Adapters are
checked from their config and tensor header (`adapters/scan.scan_adapter`: every check but NaN/Inf, no tensor
read: 256 Llama-3-8B adapters are 21 GB of values the engine reads once, when it needs them; NaN/Inf found
then fails that adapter's requests with the same message). Errors are collected per adapter
(`Preflight.errors`) so the CLI can report them all at once; only problems with the base model itself (or with
the flags) raise.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from multilora_cli.adapters.base_match import mismatch_warnings
from multilora_cli.adapters.config import CONFIG_NAME, AdapterConfig
from multilora_cli.adapters.resolve import looks_like_path, resolve
from multilora_cli.errors import AdapterError, MultiloraError, ResolveError, UnsupportedAdapterError, UsageError
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.generation_unapplied import unapplied_warning
from multilora_cli.paths import expand_user

RESERVED_NAMES = ("base",)
DEFAULT_MAX_LORAS = 8  # slots to preallocate when --max-loras is not given (vLLM's --max-loras default is 1)
MAX_AUTO_LORAS = 64


@dataclass(slots=True)
class Preflight:
    """The outcome of pre-flight. `adapters` / `ranks` hold the adapters that passed; `errors` the others."""

    model_path: Path
    model_config: ModelConfig
    adapters: dict[str, Path]
    ranks: dict[str, int]
    max_lora_rank: int
    max_loras: int
    errors: dict[str, MultiloraError] = field(default_factory=dict)  # AdapterError or ResolveError per name
    model: str = ""  # the base model as named (the --model given, or the adapters' base_model_name_or_path)
    scans: dict = field(default_factory=dict)  # name -> adapters/scan.AdapterScan of the adapters that passed
    warnings: list[str] = field(default_factory=list)  # --model is not the base an adapter names; defaults not applied


def default_name(spec: str) -> str:
    """Name of an adapter given without NAME=: the folder name for a path, the repo id for a Hub id."""
    if expand_user(spec).exists() or looks_like_path(spec):
        p = expand_user(spec)
        return p.name or p.resolve().name
    return spec.partition("@")[0]


def _same(a: str, b: str) -> bool:
    pa, pb = expand_user(a), expand_user(b)
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return a == b


def parse_adapter_specs(items: list[str], adapter_dir: str | None) -> dict[str, str]:
    """Parse repeatable `--adapters` values (comma lists of NAME=PATH, paths or Hub ids) and `--adapter-dir`.

    Returns {name: path or Hub id} in the order given. Raises UsageError for the reserved name "base", an
    empty name or path, one name given two different adapters, or an --adapter-dir without adapters.
    """
    out: dict[str, str] = {}

    def add(name: str, spec: str, origin: str) -> None:
        if not name or not spec:
            raise UsageError(f"{origin}: expected NAME=PATH, a path or a Hub id", hint="e.g. --adapters legal=./legal")
        if name.lower() in RESERVED_NAMES:
            raise UsageError(
                f"{origin}: adapter name {name!r} is reserved for the base model",
                hint="give the adapter another name with NAME=PATH",
            )
        if name in out and not _same(out[name], spec):
            raise UsageError(
                f"adapter name {name!r} is given twice: {out[name]!r} and {spec!r}",
                hint="give them different names with NAME=PATH",
            )
        out.setdefault(name, spec)

    for item in items or []:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" in part:
                name, _, spec = part.partition("=")
                add(name.strip(), spec.strip(), f"--adapters {part!r}")
            else:
                add(default_name(part), part, f"--adapters {part!r}")
    if adapter_dir is not None:
        root = expand_user(adapter_dir)
        if not root.is_dir():
            raise UsageError(f"--adapter-dir {adapter_dir!r} is not a directory")
        # hidden folders (.old-x, .Trash-1000, .cache) are skipped, as a shell glob would
        subs = sorted(
            p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / CONFIG_NAME).is_file()
        )
        if not subs:
            hint = (
                "it is an adapter itself: use --adapters"
                if (root / CONFIG_NAME).is_file()
                else "put each adapter in its own subfolder"
            )
            raise UsageError(f"--adapter-dir {adapter_dir!r} has no subfolder holding {CONFIG_NAME}", hint=hint)
        for sub in subs:
            add(sub.name, str(sub), f"--adapter-dir {adapter_dir!r}")
    return out


def adapter_base(adapter_path: Path, config: AdapterConfig) -> str | None:
    """The adapter's base model as a spec for `resolve`: a relative path is taken relative to the adapter
    folder when it exists there; a Hub id gets the config's `revision` as `@revision`."""
    base = config.base_model_name_or_path
    if not base:
        return None
    p = expand_user(base)
    if not p.is_absolute() and (adapter_path / p).exists():
        return str((adapter_path / p).resolve())
    if p.exists():
        return str(p.resolve())
    if config.revision and "@" not in base and not looks_like_path(base):
        return f"{base}@{config.revision}"
    return base


def preflight(
    specs: dict[str, str],
    model: str | None,
    *,
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
    fp8: bool = False,
) -> Preflight:
    """Resolve and validate every adapter against the base model; size the slot pool.

    model: the --model given, else the adapters' (agreeing) base_model_name_or_path. fp8: the run quantizes the
    base (--quantization fp8; an FP8 checkpoint counts anyway). Raises UsageError when no base can be determined
    or adapters disagree, ResolveError / ModelError for a bad base; per-adapter problems land in
    `Preflight.errors`.
    """
    if max_loras is not None and max_loras < 1:
        raise UsageError(f"--max-loras must be at least 1, got {max_loras}")
    if max_lora_rank is not None and max_lora_rank < 1:
        raise UsageError(f"--max-lora-rank must be at least 1, got {max_lora_rank}")
    errors: dict[str, MultiloraError] = {}
    paths: dict[str, Path] = {}
    configs: dict[str, AdapterConfig] = {}
    for name, spec in specs.items():
        try:
            paths[name] = resolve(spec, kind="adapter", name=name)
            configs[name] = AdapterConfig.from_dir(paths[name])
        except (ResolveError, AdapterError) as e:
            paths.pop(name, None)
            errors[name] = e

    given = model is not None
    if model is None:
        model = _base_from_adapters(paths, configs, errors)
    try:
        model_path = resolve(model, kind="model")
    except ResolveError as e:
        if given:
            raise
        # The user never typed this path: say where it came from (a moved or copied adapter folder keeps the
        # absolute base path it was trained with) and how to override it.
        raise ResolveError(
            f"{e.message} (it is the base_model_name_or_path of adapter(s) {', '.join(sorted(configs))})",
            hint="pass --model with the base model's folder or Hub id",
        ) from None
    model_config = ModelConfig.from_dir(model_path)
    named = replace(model_config, name_or_path=model)  # messages name the base as the user knows it

    from multilora_cli.adapters.scan import scan_adapter  # torch: only once there is work to do

    ranks: dict[str, int] = {}
    scans = {}
    for name, path in paths.items():
        try:
            adapter = scan_adapter(path, name, named)
        except AdapterError as e:
            errors[name] = e
            continue
        if max_lora_rank is not None and adapter.max_rank > max_lora_rank:
            errors[name] = AdapterError(
                f"adapter {name!r} has rank {adapter.max_rank}, above --max-lora-rank {max_lora_rank}",
                hint=f"raise --max-lora-rank to {adapter.max_rank}",
            )
            continue
        if adapter.config.use_dora and (fp8 or model_config.quantization is not None):
            # DoRA's norms ||W + s·B·A|| need the base weights unquantized (engine/dora.py): this adapter fails,
            # the others run
            errors[name] = UnsupportedAdapterError(
                f"adapter {name!r} uses DoRA, which is not served on an FP8 base",
                hint="run it on the bf16 / fp16 checkpoint, without --quantization fp8",
            )
            continue
        ranks[name] = adapter.max_rank
        scans[name] = adapter
    warnings = (
        mismatch_warnings({n: adapter_base(paths[n], configs[n]) for n in ranks}, model, model_path)
        if given
        else []  # without --model the run is on the base the adapters name
    )
    if (unapplied := unapplied_warning(model_path)) is not None:
        warnings.append(unapplied)
    return Preflight(
        model_path=model_path,
        model_config=model_config,
        adapters={n: paths[n] for n in ranks},
        ranks=ranks,
        max_lora_rank=max_lora_rank if max_lora_rank is not None else max([1, *ranks.values()]),
        max_loras=max_loras if max_loras is not None else max(1, min(len(ranks), DEFAULT_MAX_LORAS, MAX_AUTO_LORAS)),
        errors=errors,
        model=model,
        scans=scans,
        warnings=warnings,
    )


def _base_from_adapters(
    paths: dict[str, Path], configs: dict[str, AdapterConfig], errors: dict[str, MultiloraError]
) -> str:
    bases = {name: adapter_base(paths[name], cfg) for name, cfg in configs.items()}
    named = {name: b for name, b in bases.items() if b}
    distinct = sorted(set(named.values()))
    if len(distinct) > 1:
        listed = ", ".join(f"{n} -> {b}" for n, b in named.items())
        raise UsageError(
            f"the adapters name different base models ({listed})", hint="pass --model to choose the base model"
        )
    if distinct:
        return distinct[0]
    if errors and not configs:
        raise next(iter(errors.values()))
    if not bases:
        raise UsageError("no --model and no adapters given", hint="pass --model")
    raise UsageError(
        "no --model given and the adapters' adapter_config.json names no base_model_name_or_path", hint="pass --model"
    )
