"""Log-axis ticks written as the tables write numbers (1, 20, 5,000; $12,345), not as 10^3."""

from __future__ import annotations

import math

from multilora_cli.economics.units import n, pct, usd
from multilora_cli.plot.canvas import text


def log_axis(axis, lo: float, hi: float, fmt=n, counts: bool = False) -> None:
    """Major ticks at every integer step within one decade, 1-2-5 steps up to 3 decades, powers of ten beyond;
    labels by `fmt`. `counts`: whole things (tenants, GPUs): no label below 1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(max(hi, lo * 1.0001) / lo) if lo > 0 else 0
    subs = tuple(range(1, 10)) if decades <= 1 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))

    def label(v: float, _) -> str:
        if v < 1:
            return "" if counts else f"{v:g}"
        return text(fmt(round(v)))

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(NullFormatter())


def percent_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: pct(v).replace(".0%", "%")))


def plural(count: float, word: str) -> str:
    """'1 GPU', '3 GPUs' (counts as the tables write them)."""
    return f"{n(count)} {word}{'' if count == 1 else 's'}"


def usd_short(v: float) -> str:
    """$ on an axis: $950, $12k, $3.4M."""
    for unit, k in (("M", 1e6), ("k", 1e3)):
        if abs(v) >= k:
            return f"${v / k:,.3g}{unit}"
    return usd(v)
