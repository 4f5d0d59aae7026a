"""The data behind `bench --plot` and its terminal view, read from the report's rows (the `--json` rows) as is.

Tokens/s: one bar per row that runs adapters (multilora, eager, HF + PEFT), in report order, with the base-only
row as a line (the last one: the report judges the latest row of each kind, report.py). Decode step: every row
that has a roofline (base only included), its median decode step beside the median roofline of the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE_SYSTEMS = ("multilora-base", "multilora-base-eager")


@dataclass(slots=True, frozen=True)
class BenchBar:
    """One report row as drawn. `spec`: a `--rows` style name (64/64, 64/8z, hf64, base)."""

    spec: str
    label: str  # multi-line tick label: adapters, slots, distribution
    system: str
    tokens_per_s: float
    decode_step_ms: float | None
    roofline_ms: float | None
    decode_batch: int | None


@dataclass(slots=True, frozen=True)
class BenchSeries:
    rows: tuple[BenchBar, ...]  # tokens/s bars: every row but base only
    base: BenchBar | None  # the base-only line
    step_rows: tuple[BenchBar, ...]  # decode step vs roofline: rows with both
    device: str
    bandwidth_tbs: float | None
    matmul_tflops: float | None
    workload: dict  # the first row's workload (preset, rank, requests, lengths, batch): the caption's


def bar(row: dict) -> BenchBar:
    w, system = row["workload"], row["system"]
    n, slots, zipf = w["num_adapters"], w["max_loras"], w["distribution"] == "zipf"
    if system in BASE_SYSTEMS:
        spec, label = "base", "base only"
    elif system == "hf-peft":
        spec, label = f"hf{n}", f"HF + PEFT\n{n} adapters"
    else:
        prefix = "eager" if system.endswith("-eager") else ""
        spec = f"{prefix}{n}/{slots}{'z' if zipf else ''}"
        label = f"{'eager ' if prefix else ''}{n} adapters\n{slots} slots\n{w['distribution']}"
    return BenchBar(
        spec=spec,
        label=label,
        system=system,
        tokens_per_s=row["tokens_per_s"],
        decode_step_ms=row.get("decode_step_ms"),
        roofline_ms=row.get("roofline_ms"),
        decode_batch=row.get("decode_batch"),
    )


def bench_series(report: dict) -> BenchSeries:
    """The plotted series of a bench report (the dict `run_suite` returns and `--json` writes)."""
    bars = [bar(r) for r in report["rows"]]
    bases = [b for b in bars if b.system in BASE_SYSTEMS]
    return BenchSeries(
        rows=tuple(b for b in bars if b.system not in BASE_SYSTEMS),
        base=bases[-1] if bases else None,
        step_rows=tuple(b for b in bars if b.decode_step_ms is not None and b.roofline_ms is not None),
        device=(report.get("device") or {}).get("name", "?"),
        bandwidth_tbs=report.get("bandwidth_tbs"),
        matmul_tflops=report.get("matmul_tflops"),
        workload=dict(report["rows"][0]["workload"]) if report["rows"] else {},
    )
