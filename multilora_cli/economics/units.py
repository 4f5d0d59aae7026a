"""Number formatting for the report: exact counts with binary and decimal sizes side by side."""

from __future__ import annotations


def n(x: float) -> str:
    """12,345 for integers; 3 significant-ish decimals otherwise."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.1f}"


def size(b: float) -> str:
    """Bytes as binary and decimal units: '32.0 MiB (33.6 MB)'."""
    for unit, k in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            dec = next(
                (f"{b / d:,.1f} {u}" for u, d in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if b >= d),
                f"{b:,.0f} B",
            )
            return f"{b / k:,.1f} {unit} ({dec})"
    return f"{b:,.0f} B"


def seconds(t: float) -> str:
    if t >= 1:
        return f"{t:,.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:,.2f} ms"
    return f"{t * 1e6:,.1f} µs"


def usd(x: float) -> str:
    sign = "-" if x < 0 else ""  # -$1,234, not $-1,234
    return f"{sign}${abs(x):,.0f}" if abs(x) >= 100 else f"{sign}${abs(x):,.2f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
