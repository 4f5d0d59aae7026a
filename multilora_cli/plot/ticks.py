"""Log-axis ticks written as the tables write numbers (1, 20, 5,000; $12,345), not as 10^3."""

from __future__ import annotations

import math

from multilora_cli.economics.units import n, pct, usd
from multilora_cli.plot.canvas import text


def log_axis(axis, lo: float, hi: float, fmt=n) -> None:
    """Major ticks at 1-2-5 steps over a span of up to 3 decades, at powers of ten beyond; labels by `fmt`."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(max(hi, lo * 1.0001) / lo) if lo > 0 else 0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: text(fmt(round(v)) if v >= 1 else f"{v:g}")))
    axis.set_minor_formatter(NullFormatter())


def percent_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: pct(v).replace(".0%", "%")))


def usd_short(v: float) -> str:
    """$ on an axis: $950, $12k, $3.4M."""
    for unit, k in (("M", 1e6), ("k", 1e3)):
        if abs(v) >= k:
            return f"${v / k:,.3g}{unit}"
    return usd(v)
