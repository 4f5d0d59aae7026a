"""The compact terminal view: one sparkline per curve under the tables, so a shape shows over ssh without a file.

No matplotlib here: these lines print on every table run. Each line is scaled from 0 to its own largest value
and carries its numbers in plain text (first -> given -> last, or one value per row), so a pipe without colors
still reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from multilora_cli.economics.units import n, pct, usd
from multilora_cli.plot.ticks import plural

if TYPE_CHECKING:  # annotations only: the economics tables need not import the bench package (torch)
    from multilora_cli.bench.series import BenchSeries
    from multilora_cli.economics.curves import TenantCurves

BLOCKS = "▁▂▃▄▅▆▇█"
LABEL_WIDTH = 24
SEP = " · "


def sparkline(values: Sequence[float | None], top: float | None = None) -> str:
    """One block per value, height value / top (default: the largest value) in eight steps; None is a blank."""
    known = [v for v in values if v is not None]
    top = max(known, default=0.0) if top is None else top
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(BLOCKS[0])
        else:
            out.append(BLOCKS[min(len(BLOCKS) - 1, max(0, int(v / top * len(BLOCKS))))])
    return "".join(out)


def economics_lines(c: TenantCurves) -> list:
    """rich Text lines: a header naming the sweep, then dedicated / shared GPUs and $/month, slot hit rate, slot
    loads per step and the host-to-GPU limit; the given tenant count's block in bold reverse."""
    from rich.text import Text

    g = c.given_index

    def line(label: str, values: Sequence[float], fmt) -> Text:
        spark = sparkline(values)
        t = Text(f"{label:<{LABEL_WIDTH}} ")
        t.append(spark[:g])
        t.append(spark[g], style="bold reverse")
        t.append(spark[g + 1 :])
        t.append(f"  {fmt(values[0])} → {fmt(values[g])} → {fmt(values[-1])}")
        return t

    head = Text(
        f"Over tenants {n(c.tenants[0])} → {n(c.given)} (given, highlighted) → {n(c.tenants[-1])}, log-spaced, "
        f"{plural(c.max_loras, 'slot')}, {c.popularity}; each line scaled 0 → its largest value:",
        style="bold",
    )
    return [
        head,
        line("dedicated GPUs", c.dedicated_gpus, n),
        line("shared GPUs", c.shared_gpus, n),
        line("dedicated $/month", c.usd_per_month_dedicated, usd),
        line("shared $/month", c.usd_per_month_shared, usd),
        line("slot hit rate", c.hit_rate, pct),
        line("slot loads per step", c.loads_per_step, n),
        line("host->GPU limit, loads", c.max_loads_per_step_pcie, n),
    ]


def bench_lines(s: BenchSeries) -> list[str]:
    """Plain lines, each value named by its row's `--rows` spec: tokens/s per row with base only beside it, then
    decode step and roofline per row on one scale, so their gap shows."""
    lines = []
    if s.rows or s.base:
        tps = [r.tokens_per_s for r in s.rows]
        top = max(tps + ([s.base.tokens_per_s] if s.base else []))
        values = [f"{r.spec} {r.tokens_per_s:,.0f}" for r in s.rows]
        values += [f"base only {s.base.tokens_per_s:,.0f} (the line)"] if s.base else []
        lines.append(f"{'out tok/s':<{LABEL_WIDTH}} {sparkline(tps, top)}  {SEP.join(values)}")
    if s.step_rows:
        steps = [r.decode_step_ms for r in s.step_rows]
        roofs = [r.roofline_ms for r in s.step_rows]
        top = max(steps + roofs)
        for label, values in (("decode step ms", steps), ("roofline ms", roofs)):
            named = SEP.join(f"{r.spec} {v:.2f}" for r, v in zip(s.step_rows, values))
            lines.append(f"{label:<{LABEL_WIDTH}} {sparkline(values, top)}  {named}")
    return lines
