"""`economics --plot`: GPUs and $/month vs tenants (dedicated vs shared), and the slots' hit rate and loads per
step vs tenants against the host-to-GPU limit; every assumption in the caption.

Everything drawn is a `TenantCurves` field (economics/curves.py: whole reports over a tenant sweep) or a figure
of the given report; nothing is recomputed here. Each line carries its curve's name as its gid.
"""

from __future__ import annotations

from multilora_cli.economics.curves import TenantCurves
from multilora_cli.economics.render import assumption_value
from multilora_cli.economics.report import Report
from multilora_cli.economics.units import n, pct, usd
from multilora_cli.plot.canvas import COLORS, caption, new_figure, style, text, to_bytes
from multilora_cli.plot.ticks import log_axis, percent_axis, plural, usd_short

SIZE = (12.0, 8.5)  # inches: 1200 x 850 px as PNG, 864 x 612 pt as SVG


def render_economics(c: TenantCurves, report: Report, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes."""
    with style():
        return to_bytes(economics_figure(c, report), fmt)


def economics_figure(c: TenantCurves, report: Report):
    """The matplotlib Figure (call inside `canvas.style()`)."""
    import textwrap

    fig = new_figure(*SIZE)
    fig.text(0.5, 0.985, text("\n".join(textwrap.wrap(report.summary, 150))), ha="center", va="top", fontsize=10)
    _fleet(fig.add_axes((0.06, 0.49, 0.36, 0.40)), c)
    _slots(fig.add_axes((0.57, 0.49, 0.36, 0.40)), c)
    slots = report.section("slots")
    lines = [
        f"Each point is the whole report at that tenant count with every other input as given (--max-loras fixed "
        f"at {c.max_loras}); the marked point is the given {plural(c.given, 'tenant')}. Slot figures are per replica "
        f"(tenants pinned to replicas: {n(slots['tenants_per_replica'])} at the given point). Host->GPU limit: "
        "slot loads that fill one decode step (decode step × PCIe / adapter bytes). Assumptions, as the "
        "tables print them:",
    ]
    for a in report.assumptions:
        lines.append(f"• {a.label}: {assumption_value(a)} [{a.source}]" + (f" ({a.note})" if a.note else ""))
    lines += [f"• warning: {w}" for w in report.warnings]
    caption(fig, lines, (0.02, 0.01, 0.98, 0.285))
    return fig


def _given(ax, c: TenantCurves, values, color: str, gid: str) -> None:
    g = c.given_index
    ax.plot([c.given], [values[g]], "o", ms=8, mfc="none", mec=color, mew=1.8, gid=f"given:{gid}")


def _xlim(ax, c: TenantCurves) -> None:
    ax.set_xlim(c.tenants[0] / 1.15, c.tenants[-1] * 1.15)  # a little room: the end points' markers show whole


def _fleet(ax, c: TenantCurves) -> None:
    g = c.given_index
    for key, who in (("dedicated", "dedicated full copies"), ("shared", "one shared base + LoRA")):
        gpus, month = getattr(c, f"{key}_gpus"), getattr(c, f"usd_per_month_{key}")
        label = f"{who}: {plural(gpus[g], 'GPU')}, {usd(month[g])}/month at {plural(c.given, 'tenant')}"
        ax.plot(c.tenants, gpus, "-o", ms=2.5, color=COLORS[key], label=text(label), gid=f"{key}_gpus")
        _given(ax, c, gpus, COLORS[key], f"{key}_gpus")
    ax.axvline(c.given, ls=":", color="#888888", lw=1, gid="given")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _xlim(ax, c)
    top = max(max(c.dedicated_gpus), max(c.shared_gpus))
    ax.set_ylim(0.8, top * 1.5)
    log_axis(ax.xaxis, c.tenants[0], c.tenants[-1], counts=True)
    log_axis(ax.yaxis, 1, top, counts=True)
    ax.set_xlabel("tenants (one adapter each)")
    ax.set_ylabel("GPUs needed")
    per_gpu = c.usd_per_month_dedicated[g] / c.dedicated_gpus[g]  # the report's $/month per GPU
    if per_gpu > 0:  # a free GPU has no $ axis to draw
        sec = ax.secondary_yaxis("right", functions=(lambda v: v * per_gpu, lambda v: v / per_gpu))
        log_axis(sec.yaxis, per_gpu, top * per_gpu, fmt=usd_short)
        sec.set_ylabel(text("$/month"))
        ax.set_title(text("GPUs (left axis) and $/month (right axis) vs tenants"))
    else:
        ax.set_title(text("GPUs vs tenants (at $0 per GPU-hour, no $/month axis)"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), frameon=False)


def _slots(ax, c: TenantCurves) -> None:
    g = c.given_index
    ax.plot(c.tenants, c.hit_rate, "-o", ms=2.5, color=COLORS["hit"], gid="hit_rate")
    _given(ax, c, c.hit_rate, COLORS["hit"], "hit_rate")
    ax.axvline(c.given, ls=":", color="#888888", lw=1, gid="given")
    ax.set_xscale("log")
    _xlim(ax, c)
    log_axis(ax.xaxis, c.tenants[0], c.tenants[-1], counts=True)
    ax.set_ylim(0, 1.05)
    percent_axis(ax.yaxis)
    ax.set_xlabel("tenants (one adapter each)")
    ax.set_ylabel("expected slot hit rate (per new request)")
    ax.set_title(text(f"{plural(c.max_loras, 'GPU slot')}, {c.popularity} popularity, LRU per replica"))
    tw = ax.twinx()
    tw.grid(False)
    tw.set_yscale("log", nonpositive="mask")  # no loads (every tenant fits the slots) is not drawn
    tw.plot(c.tenants, c.loads_per_step, "-o", ms=2.5, color=COLORS["loads"], gid="loads_per_step")
    _given(tw, c, c.loads_per_step, COLORS["loads"], "loads_per_step")
    limit = c.max_loads_per_step_pcie
    tw.plot(c.tenants, limit, "--", color=COLORS["limit"], lw=1.5, gid="max_loads_per_step_pcie")
    positive = [v for v in (*c.loads_per_step, *limit) if v > 0]
    lo, hi = min(positive), max(positive)
    tw.set_ylim(lo / 2, hi * 2)
    log_axis(tw.yaxis, lo, hi)
    tw.set_ylabel("slot loads per decode step (log)")
    _xlim(ax, c)
    handles = [ax.lines[0], tw.lines[0], tw.lines[2]]
    labels = [
        f"slot hit rate (left): {pct(c.hit_rate[g])} at {plural(c.given, 'tenant')}",
        f"slot loads per step (right): {n(c.loads_per_step[g])}",
        f"host->GPU limit (right): {n(limit[g])} loads per step",
    ]
    ax.legend(handles, [text(s) for s in labels], loc="upper center", bbox_to_anchor=(0.5, -0.11), frameon=False)
