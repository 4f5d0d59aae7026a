"""Deterministic figures: the same data gives byte-identical PNG and SVG files.

Fixed size, dpi and font (DejaVu Sans, which matplotlib ships), matplotlib's built-in defaults rather than the
user's matplotlibrc, a fixed `svg.hashsalt` (SVG element ids are hashes salted with it) and no date or software
stamp in the file. Figures are drawn on the Agg canvas directly: pyplot and its global state are never imported.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager

DPI = 100  # a figure of W x H inches is W*DPI x H*DPI pixels as PNG, W*72 x H*72 pt as SVG
FONT = "DejaVu Sans"
STYLE = {
    "font.family": "sans-serif",
    "font.sans-serif": [FONT],
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.edgecolor": "white",
    "svg.fonttype": "path",  # glyphs as paths: the file looks the same without the font installed
    "svg.hashsalt": "multilora",
    "axes.grid": True,
    "grid.alpha": 0.3,
}
METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": "multilora"}}
COLORS = {  # one color per idea, the same in every figure
    "dedicated": "#c0392b",
    "shared": "#2471a3",
    "hit": "#1e8449",
    "loads": "#d68910",
    "limit": "#4d4d4d",
    "base": "#4d4d4d",
    "roofline": "#2471a3",
    "excess": "#aed6f1",
    "rows": "#2471a3",
}


@contextmanager
def style() -> Iterator[None]:
    """matplotlib's own defaults plus STYLE, inside this block only (the user's rcParams come back after)."""
    import matplotlib

    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # ignore a matplotlibrc: the same data must give the same bytes anywhere
        matplotlib.rcParams.update(STYLE)
        yield


def new_figure(width_in: float, height_in: float):
    """A matplotlib Figure of that size on the Agg canvas (call inside `style()`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def to_bytes(fig, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes at its own size (never cropped: the stated size is the file's size)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=DPI, metadata=METADATA[fmt])
    return buf.getvalue()


def text(s: str) -> str:
    """Plain text for matplotlib: a '$' would start mathtext ("$2/h ... $3/month" renders as math)."""
    return s.replace("$", r"\$")


def caption(fig, lines: list[str], box: tuple[float, float, float, float], columns: int = 2, size: float = 7.0):
    """Write `lines` in `columns` columns inside `box` (x0, y0, x1, y1 in figure fractions), wrapped to the
    column width; the font shrinks (from `size`) until every line fits the box's height."""
    import textwrap

    x0, y0, x1, y1 = box
    w_in, h_in = fig.get_size_inches()
    col_pt = (x1 - x0) * w_in * 72 / columns
    while True:
        chars = max(20, int(col_pt / (0.52 * size)))  # DejaVu Sans: about 0.5 em per character of prose
        wrapped = [w for line in lines for w in textwrap.wrap(line, chars, subsequent_indent="    ") or [""]]
        per_col = -(-len(wrapped) // columns)
        if per_col * size * 1.25 <= (y1 - y0) * h_in * 72 or size <= 4:
            break
        size -= 0.5
    for i in range(columns):
        chunk = wrapped[i * per_col : (i + 1) * per_col]
        fig.text(
            x0 + i * (x1 - x0) / columns,
            y1,
            text("\n".join(chunk)),
            ha="left",
            va="top",
            fontsize=size,
            linespacing=1.25,
            color="#333333",
        )
