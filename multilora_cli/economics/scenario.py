"""The inputs of an economics report: raw flag values (`Scenario`) and what they resolve to (`Resolved`).

Every number the arithmetic uses is an `Assumption` carrying its source (flag, default, preset, measured),
so the report can print each one beside the figures that follow from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from multilora_cli.adapters.costs import dora_slot_bytes
from multilora_cli.config import GPU_MEMORY_UTILIZATION, QUANTIZATIONS
from multilora_cli.economics.comparable import Comparability, compare
from multilora_cli.economics.presets import DTYPE_BYTES, GPU_PRESETS, HOURS_PER_MONTH, GpuSpec
from multilora_cli.economics.shapes import DEFAULT_RANK, AdapterShape, parse_targets, shape_from_flags
from multilora_cli.economics.slots import POPULARITIES
from multilora_cli.economics.sources import (
    MeasuredRun,
    ModelSource,
    adapter_dir,
    load_adapter_shape,
    load_stats,
    resolve_model,
)
from multilora_cli.engine.slot_budget import SlotChoice, SlotInputs, choose_max_loras, slot_bytes
from multilora_cli.errors import ResolveError, UsageError
from multilora_cli.models.quantization import base_bytes

# The slot arithmetic holds one float per tenant (slots.py): 10M tenants is 80 MB and a second; 1e9 exhausted memory.
MAX_TENANTS = 10_000_000


@dataclass(slots=True)
class Scenario:
    """Raw `multilora economics` inputs; None = take it from the preset, the adapter, the stats or a default."""

    tenants: int
    model: str | None = None
    rank: int | None = None
    targets: str | None = None
    adapter: str | None = None
    dtype: str = "bfloat16"
    quantization: str = "none"  # "fp8": the base's decoder projections in FP8 (an FP8 checkpoint is FP8 anyway)
    gpu: str = "h100-sxm"
    gpu_memory_gb: float | None = None
    gpu_bandwidth_tbs: float | None = None
    gpu_hour_usd: float | None = None
    pcie_gbs: float | None = None
    bandwidth_efficiency: float = 0.8
    kv_reserve: float = 0.3
    batch_size: int = 64
    context_len: int = 1024
    tokens_per_tenant_per_s: float = 50.0
    max_loras: int | None = None  # None: what `multilora run` would allocate (engine/slot_budget.py)
    popularity: str = "uniform"
    zipf_s: float = 1.0
    output_tokens: float | None = None
    requests_per_step: float | None = None
    stats: str | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, flag: str, what: str, value) -> None:
            if not ok:
                raise UsageError(f"{flag} must be {what}, got {value}")

        need(self.tenants >= 1, "--tenants", "a positive integer", self.tenants)
        need(self.tenants <= MAX_TENANTS, "--tenants", f"at most {MAX_TENANTS:,}", f"{self.tenants:,}")
        need(self.rank is None or self.rank >= 1, "--rank", "a positive integer", self.rank)
        need(self.dtype in DTYPE_BYTES, "--dtype", f"one of {', '.join(DTYPE_BYTES)}", self.dtype)
        need(
            self.quantization in QUANTIZATIONS,
            "--quantization",
            f"one of {', '.join(QUANTIZATIONS)}",
            self.quantization,
        )
        need(self.gpu.lower() in GPU_PRESETS, "--gpu", f"one of {', '.join(GPU_PRESETS)}", repr(self.gpu))
        # (flag, value, lowest, whether the lowest itself is allowed, highest). The highest values lie far past
        # any real GPU or workload; beyond them the arithmetic overflows to inf / NaN or divides by zero. inf and
        # NaN are refused by name, as they pass or fail the comparisons arbitrarily.
        for flag, v, lo, closed, hi in (
            ("--gpu-memory-gb", self.gpu_memory_gb, 0, False, 1e5),
            ("--gpu-bandwidth-tbs", self.gpu_bandwidth_tbs, 1e-3, True, 1e3),
            ("--pcie-gbs", self.pcie_gbs, 1e-3, True, 1e4),
            ("--gpu-hour-usd", self.gpu_hour_usd, 0, True, 1e4),
            ("--tokens-per-tenant-per-s", self.tokens_per_tenant_per_s, 0, False, 1e9),
            ("--output-tokens", self.output_tokens, 1, True, 1e9),  # a request generates one token at least
            ("--requests-per-step", self.requests_per_step, 0, False, 1e9),
            ("--zipf-s", self.zipf_s, 0, True, 100),
        ):
            if v is None:
                continue
            need(math.isfinite(v), flag, "a finite number", v)
            need(v >= lo if closed else v > lo, flag, f"{'>=' if closed else '>'} {lo:g}", v)
            need(v <= hi, flag, f"at most {hi:g}", v)
        need(0 < self.bandwidth_efficiency <= 1, "--bandwidth-efficiency", "in (0, 1]", self.bandwidth_efficiency)
        need(0 < self.kv_reserve < 1, "--kv-reserve", "in (0, 1)", self.kv_reserve)
        need(self.batch_size >= 1, "--batch-size", "a positive integer", self.batch_size)
        need(self.context_len >= 1, "--context-len", "a positive integer", self.context_len)
        need(self.max_loras is None or self.max_loras >= 1, "--max-loras", "a positive integer", self.max_loras)
        need(
            self.popularity in POPULARITIES, "--popularity", f"one of {', '.join(POPULARITIES)}", repr(self.popularity)
        )
        if self.adapter and (self.rank is not None or self.targets is not None):
            raise UsageError("--adapter reads rank and targets from the adapter; drop --rank / --targets")


@dataclass(slots=True)
class Assumption:
    key: str
    label: str
    value: object
    unit: str
    source: str  # "flag" | "default" | "preset <name>" | "measured" | "derived" | "adapter" | ...
    note: str = ""


@dataclass(slots=True)
class Resolved:
    """A scenario with its model, adapter, GPU and measured run loaded."""

    scenario: Scenario
    model: ModelSource
    adapter: AdapterShape
    gpu: GpuSpec
    stats: MeasuredRun | None
    dtype_bytes: int
    output_tokens: float
    requests_per_step: float | None  # None: derived later from the batch that fits
    comparable: Comparability | None = None  # with stats: may their tokens/s and step time size the fleet
    max_loras: int = 1  # GPU adapter slots: --max-loras, else run's default on this GPU
    fp8: bool = False  # the base's decoder projections are FP8 (--quantization fp8 or an FP8 checkpoint)
    assumptions: list[Assumption] = field(default_factory=list)

    def add(self, key: str, label: str, value, unit: str, source: str, note: str = "") -> None:
        self.assumptions.append(Assumption(key, label, value, unit, source, note))


def default_slots(
    s: Scenario, adapter: AdapterShape, gpu: GpuSpec, cfg, dtype_bytes: int, fp8: bool = False
) -> SlotChoice:
    """The slots `multilora run` would allocate for `s.tenants` adapters of this shape on one such GPU, by the
    run's own rule (engine/slot_budget.choose_max_loras), with the scenario's batch and context as the workload
    (its slots hold all seven projections at the adapter's largest rank, whatever the adapter targets; FP8 bases
    leave more room beside them)."""
    spare = gpu.memory_gb * 1e9 * GPU_MEMORY_UTILIZATION - base_bytes(cfg, dtype_bytes, fp8)
    one = slot_bytes(cfg, adapter.max_rank, dtype_bytes)
    if adapter.dora_params:  # a run with a DoRA adapter: float32 scale rows per slot too (adapters/costs.py)
        one += dora_slot_bytes(cfg)
    # modules_to_save copies of embed_tokens / lm_head; LoRA on them (rows "embed_tokens" / "lm_head")
    one += adapter.full_params * dtype_bytes
    one += (
        sum(
            adapter.max_rank * (m.in_features + m.out_features)
            for m in adapter.modules
            if m.module in ("embed_tokens", "lm_head")
        )
        * dtype_bytes
    )
    return choose_max_loras(
        SlotInputs(
            adapters=s.tenants,
            one_slot=one,
            spare=int(spare),
            max_num_seqs=s.batch_size,
            context=s.context_len,
            kv_token=cfg.kv_bytes_per_token(dtype_bytes),
        )
    )


def resolve(s: Scenario) -> Resolved:
    """Load the model shape, adapter shape, GPU spec and stats that `s` names; record every assumption."""
    stats = load_stats(s.stats) if s.stats else None
    path, base = adapter_dir(s.adapter) if s.adapter else (None, None)
    model_spec = s.model or base
    try:
        model = resolve_model(model_spec)
    except ResolveError as e:
        if s.model:
            raise
        raise ResolveError(
            f"{e.message} (it is the base_model_name_or_path of --adapter {s.adapter})",
            hint="pass --model with the base model's folder, Hub id or a preset",
        ) from None
    if path is not None:
        adapter = load_adapter_shape(path, model.config)
    else:
        adapter = shape_from_flags(
            model.config, s.rank if s.rank is not None else DEFAULT_RANK, parse_targets(s.targets)
        )
    preset = GPU_PRESETS[s.gpu.lower()]
    gpu = GpuSpec(
        preset.name,
        s.gpu_memory_gb or preset.memory_gb,
        s.gpu_bandwidth_tbs or preset.bandwidth_tbs,
        preset.hour_usd if s.gpu_hour_usd is None else s.gpu_hour_usd,
        s.pcie_gbs or preset.pcie_gbs,
        preset.pcie_note if s.pcie_gbs is None else "given",
    )
    measured_out = stats.mean_completion_tokens if stats else None
    out_tokens = s.output_tokens or measured_out or 256.0
    comparable = compare(stats, model, gpu, s.dtype) if stats else None
    r = Resolved(s, model, adapter, gpu, stats, DTYPE_BYTES[s.dtype], out_tokens, s.requests_per_step, comparable)
    r.fp8 = s.quantization == "fp8" or model.config.quantization is not None

    def src(given, default: str = "default") -> str:
        return "flag" if given is not None else default

    gsrc = f"preset {gpu.name}"
    cfg = model.config

    r.add("tenants", "tenants (one adapter each)", s.tenants, "", "flag")
    r.add(
        "model",
        "base model",
        model.label,
        "",
        model.source,
        f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, "
        f"heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} kv, head_dim {cfg.head_dim}, "
        f"vocab {cfg.vocab_size}, {'tied' if cfg.tie_word_embeddings else 'untied'} embeddings",
    )
    r.add(
        "dtype",
        "serving dtype (base and adapters)",
        s.dtype,
        f"{r.dtype_bytes} B/param",
        src(None),
        "adapters are cast to the base dtype when loaded into slots",
    )
    r.add(
        "quantization",
        "base weights",
        model.config.quantization.describe() if model.config.quantization else "fp8" if r.fp8 else "unquantized",
        "1 B/param (decoder projections)" if r.fp8 else f"{r.dtype_bytes} B/param",
        "checkpoint" if model.config.quantization else src(None if s.quantization == "none" else s.quantization),
        "embeddings, norms, LM head and adapters stay in the serving dtype" if r.fp8 else "",
    )
    r.add(
        "adapter",
        "adapter shape",
        adapter.source,
        "",
        "adapter" if path else src(s.rank, src(s.targets)),
        f"rank {'/'.join(map(str, adapter.ranks))} on {','.join(adapter.targets)}",
    )
    r.add("gpu", "GPU", gpu.name, "", "flag" if s.gpu != "h100-sxm" else "default")
    r.add("gpu_memory_gb", "GPU memory", gpu.memory_gb, "GB (1e9 B)", src(s.gpu_memory_gb, gsrc))
    r.add("gpu_bandwidth_tbs", "GPU HBM bandwidth (peak)", gpu.bandwidth_tbs, "TB/s", src(s.gpu_bandwidth_tbs, gsrc))
    r.add(
        "bandwidth_efficiency",
        "achieved fraction of peak bandwidth",
        s.bandwidth_efficiency,
        "",
        "default" if s.bandwidth_efficiency == 0.8 else "flag",
        "decode kernels typically reach 60-85% of peak",
    )
    r.add(
        "gpu_hour_usd",
        "price per GPU-hour",
        gpu.hour_usd,
        "USD",
        src(s.gpu_hour_usd, gsrc),
        "assumed on-demand list price; varies 2-3x by provider and commitment",
    )
    r.add("hours_per_month", "hours per month", HOURS_PER_MONTH, "h", "default", "8760 h / 12")
    r.add("pcie_gbs", "host->GPU copy bandwidth", gpu.pcie_gbs, "GB/s", src(s.pcie_gbs, gsrc), gpu.pcie_note)
    r.add(
        "kv_reserve",
        "GPU memory kept for KV cache + activations",
        s.kv_reserve,
        "fraction",
        "default" if s.kv_reserve == 0.3 else "flag",
        "weights (base + resident adapters) get the rest",
    )
    r.add(
        "batch_size",
        "decode batch (sequences per step), at most",
        s.batch_size,
        "seqs",
        "default" if s.batch_size == 64 else "flag",
        "capped by the sequences whose KV fits the reserve",
    )
    r.add(
        "context_len",
        "mean context per sequence",
        s.context_len,
        "tokens",
        "default" if s.context_len == 1024 else "flag",
        "prompt + generated so far; sets KV bytes per sequence",
    )
    r.add(
        "tokens_per_tenant_per_s",
        "demand per tenant (generated tokens/s, sustained)",
        s.tokens_per_tenant_per_s,
        "tok/s",
        "default" if s.tokens_per_tenant_per_s == 50.0 else "flag",
    )
    auto = default_slots(s, adapter, gpu, cfg, r.dtype_bytes, r.fp8) if s.max_loras is None else None
    r.max_loras = s.max_loras if auto is None else auto.max_loras
    r.add(
        "max_loras",
        "GPU adapter slots (--max-loras)",
        r.max_loras,
        "slots",
        src(s.max_loras),
        "distinct adapters one step may use"
        + (
            ""
            if auto is None
            else f"; multilora run's default ({GPU_MEMORY_UTILIZATION:g} x GPU memory): {auto.reason}"
        ),
    )
    r.add(
        "popularity",
        "tenant popularity",
        s.popularity if s.popularity == "uniform" else f"zipf s={s.zipf_s}",
        "",
        "default" if s.popularity == "uniform" else "flag",
        "independent reference model",
    )
    r.add(
        "output_tokens",
        "mean generated tokens per request",
        out_tokens,
        "tokens",
        "flag" if s.output_tokens else "measured" if measured_out else "default",
    )
    if stats:
        r.add(
            "stats",
            "measured run",
            stats.path,
            "",
            "flag",
            f"model {stats.model or '?'} on {stats.device or '?'}: "
            f"{stats.completion_tokens_per_second:,.1f} generated tok/s"
            + (f" per worker of {stats.workers} (data parallel); " if stats.workers > 1 else "; ")
            + ("sizes the fleet" if comparable.ok else "not comparable, shown only (see the warning)"),
        )
    return r
