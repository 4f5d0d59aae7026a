"""`bench --plot` (and benchmarks.render_results): tokens/s per row with base only as a line, and each row's
decode step stacked on its roofline.

Everything drawn is a `BenchSeries` field (bench/series.py: the report's rows as they are in `--json`). Bars are
labelled by container: "tokens_per_s", "roofline_ms" (the lower part of a step bar, up to the roofline),
"above_roofline_ms" (the rest of the step); the base-only line has gid "base_tokens_per_s", the roofline ticks
gid "roofline_ms".
"""

from __future__ import annotations

from multilora_cli.bench.series import BenchSeries
from multilora_cli.plot.canvas import COLORS, caption, new_figure, style, text, to_bytes

PER_ROW = ("num_adapters", "max_loras", "distribution", "zipf_s")  # in each bar's label, not the caption
SIZE = (12.0, 6.5)  # inches: 1200 x 650 px as PNG, 864 x 468 pt as SVG


def render_bench(s: BenchSeries, fmt: str, title: str | None = None) -> bytes:
    """The figure as PNG or SVG bytes; `title` replaces the default (device and workload)."""
    with style():
        return to_bytes(bench_figure(s, title), fmt)


def bench_figure(s: BenchSeries, title: str | None = None):
    """The matplotlib Figure (call inside `canvas.style()`)."""
    import textwrap

    w = s.workload
    if title is None:
        title = (
            f"multilora bench on {s.device}: {w.get('preset', '?')} shapes, rank {w.get('rank', '?')}, "
            f"{w.get('num_requests', '?')} requests of {w.get('prompt_len', '?')} + {w.get('output_len', '?')} "
            f"tokens, at most {w.get('max_num_seqs', '?')} sequences"
        )
    fig = new_figure(*SIZE)
    fig.text(0.5, 0.975, text("\n".join(textwrap.wrap(title, 150))), ha="center", va="top", fontsize=10)
    _tokens(fig.add_axes((0.07, 0.33, 0.40, 0.55)), s)
    _steps(fig.add_axes((0.57, 0.33, 0.40, 0.55)), s)
    bw = f"{s.bandwidth_tbs:.2f} TB/s" if s.bandwidth_tbs else "?"
    lines = [
        "tok/s: generated tokens / wall seconds of the timed run. Decode step (the bar's full height): the median step at the most common "
        "decode batch (under each bar); roofline: the median over the same steps of (base weights + live KV + the "
        f"step's distinct adapters, each read once) / the copy bandwidth measured in the same run ({bw}), the dark part "
        "and its black tick.",
        "Workload of every row: " + ", ".join(f"{k} {v}" for k, v in w.items() if k not in PER_ROW) + ".",
    ]
    if any(r.roofline_ms is None for r in s.rows):
        lines.append("Rows without a roofline (HF + PEFT: timed on a few tokens, extrapolated) have no step bar.")
    caption(fig, lines, (0.03, 0.01, 0.97, 0.13), columns=1)
    return fig


def _bar_labels(ax, bars, fmt) -> None:
    for b in bars:
        ax.annotate(
            text(fmt(b)),
            (b.get_x() + b.get_width() / 2, b.get_y() + b.get_height()),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )


def _tokens(ax, s: BenchSeries) -> None:
    x = list(range(len(s.rows)))
    tps = [r.tokens_per_s for r in s.rows]
    bars = ax.bar(x, tps, width=0.6, color=COLORS["rows"], label="tokens_per_s")
    _bar_labels(ax, bars, lambda b: f"{b.get_height():,.0f}")
    top = max(tps + ([s.base.tokens_per_s] if s.base else []), default=1.0)
    if s.base:
        ax.axhline(s.base.tokens_per_s, ls="--", lw=1.5, color=COLORS["base"], gid="base_tokens_per_s")
        ax.annotate(
            f"base only: {s.base.tokens_per_s:,.0f} tok/s",
            (1.0, s.base.tokens_per_s),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=8,
            color=COLORS["base"],
        )
    ax.set_xticks(x, [r.label for r in s.rows], fontsize=7)
    ax.set_xlim(-0.6, max(len(x), 1) - 0.4)
    ax.set_ylim(0, top * 1.15)
    from matplotlib.ticker import StrMethodFormatter

    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_ylabel("generated tokens/s")
    ax.set_title("tokens/s per row" + (" (base only as the line)" if s.base else ""))
    ax.grid(axis="x", visible=False)
    if not s.rows:
        ax.text(0.5, 0.5, "no rows with adapters", transform=ax.transAxes, ha="center", va="center")


def _steps(ax, s: BenchSeries) -> None:
    rows = s.step_rows
    x = list(range(len(rows)))
    roof = [r.roofline_ms for r in rows]
    step = [r.decode_step_ms for r in rows]
    low = [min(a, b) for a, b in zip(roof, step)]
    above = [max(0.0, b - a) for a, b in zip(roof, step)]
    ax.bar(x, low, width=0.6, color=COLORS["roofline"], label="roofline_ms")
    ax.bar(x, above, width=0.6, bottom=low, color=COLORS["excess"], label="above_roofline_ms")
    for i, r in enumerate(rows):
        ax.annotate(
            f"{r.decode_step_ms:.2f} ms\n{r.decode_step_ms / r.roofline_ms:.2f}×",
            (i, max(step[i], roof[i])),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.plot(x, roof, "_", ms=28, mew=2, color="black", gid="roofline_ms", linestyle="none")
    labels = [f"{r.label}\n(batch {r.decode_batch})" if r.decode_batch else r.label for r in rows]
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_xlim(-0.6, max(len(x), 1) - 0.4)
    ax.set_ylim(0, max(step + roof, default=1.0) * 1.2)
    ax.set_ylabel("ms per decode step")
    ax.set_title("decode step (light) stacked on its roofline (dark)")
    ax.grid(axis="x", visible=False)
    if not rows:
        ax.text(0.5, 0.5, "no rows with a roofline", transform=ax.transAxes, ha="center", va="center")
