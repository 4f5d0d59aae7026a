"""Progress on stderr while a run goes, and the summary table at the end. Never touches stdout.

A rich progress bar when stderr is a terminal (Console(stderr=True), with rich's stdout/stderr redirection off
so JSONL on stdout is never interleaved with bar output); a plain line every LOG_EVERY seconds otherwise;
nothing with --quiet.
"""

from __future__ import annotations

import sys
import time

LOG_EVERY = 15.0  # seconds between plain progress lines when stderr is not a terminal


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class Progress:
    """The interface the run drives: `update` after each record, `close` at the end."""

    def start(self, total: int | None) -> None: ...

    def update(self, done: int, errors: int, tokens: int, adapters_active: int, slot_loads: int) -> None: ...

    def close(self) -> None: ...


class RichProgress(Progress):
    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RP

        self._t0 = time.perf_counter()
        self._bar = RP(
            SpinnerColumn(),
            TextColumn("[bold]multilora run"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=stderr_console(),
            redirect_stdout=False,
            redirect_stderr=False,
            transient=False,
            refresh_per_second=4,
        )
        self._task = None

    def start(self, total: int | None) -> None:
        self._t0 = time.perf_counter()
        self._bar.start()
        self._task = self._bar.add_task("run", total=total, info="")

    def update(self, done: int, errors: int, tokens: int, adapters_active: int, slot_loads: int) -> None:
        dt = max(time.perf_counter() - self._t0, 1e-9)
        info = f"{tokens / dt:,.0f} tok/s · {adapters_active} adapters active · {slot_loads} loads"
        if errors:
            info += f" · [red]{errors} errors"
        self._bar.update(self._task, completed=done, info=info)

    def close(self) -> None:
        self._bar.stop()


class PlainProgress(Progress):
    def __init__(self, stream=None, every: float = LOG_EVERY) -> None:
        self._stream = stream or sys.stderr
        self._every = every
        self._t0 = self._last = time.perf_counter()
        self._total: int | None = None

    def start(self, total: int | None) -> None:
        self._total = total
        self._t0 = self._last = time.perf_counter()

    def update(self, done: int, errors: int, tokens: int, adapters_active: int, slot_loads: int) -> None:
        now = time.perf_counter()
        if now - self._last < self._every:
            return
        self._last = now
        of = f"/{self._total}" if self._total is not None else ""
        print(
            f"multilora: {done}{of} records, {errors} errors, {tokens / (now - self._t0):,.0f} tok/s, "
            f"{slot_loads} adapter loads",
            file=self._stream,
            flush=True,
        )


def make_progress(quiet: bool) -> Progress:
    if quiet:
        return Progress()
    return RichProgress() if sys.stderr.isatty() else PlainProgress()


def print_summary(stats: dict, console=None) -> None:
    """A rich summary table of the stats JSON on stderr."""
    from rich.table import Table

    console = console or stderr_console()
    t = Table(title="multilora run", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("model", f"{stats.get('model') or '-'} on {stats.get('device') or '-'} ({stats.get('dtype') or '-'})")
    resumed = f" (+{stats['resumed']} kept from the earlier run)" if stats.get("resumed") else ""
    t.add_row("records", f"{stats['requests']} written: {stats['ok']} ok, {stats['errors']} errors{resumed}")
    if stats.get("error_codes"):
        t.add_row("error codes", ", ".join(f"{k} x{v}" for k, v in stats["error_codes"].items()))
    t.add_row("tokens", f"{stats['prompt_tokens']:,} prompt + {stats['completion_tokens']:,} completion")
    t.add_row("time", f"{stats['wall_seconds']:.2f} s wall, {stats['generation_seconds']:.2f} s generating")
    t.add_row(
        "throughput",
        f"{stats['tokens_per_second']:,.1f} tok/s ({stats['completion_tokens_per_second']:,.1f} completion tok/s)",
    )
    t.add_row(
        "adapter slots",
        f"{stats['slot_loads']} loads, {stats['slot_evictions']} evictions, "
        f"{stats['slot_hits']} hits (max_loras {stats['max_loras']})",
    )
    if stats.get("slots"):  # how the slot count was chosen (engine/slot_budget.py)
        t.add_row("slot count", f"{stats['slots']['max_loras']}: {stats['slots']['reason']}")
        if stats["slots"].get("host_cache"):
            t.add_row("host cache", stats["slots"]["host_cache"])
    pc = stats.get("prefix_cache")
    if pc:
        t.add_row(
            "prefix cache",
            f"{pc['hit_tokens']:,} of {pc['prompt_tokens']:,} prompt tokens from cache ({pc['hit_rate']:.1%})",
        )
    c = stats.get("cost")
    if c:
        per = f", ${c['usd_per_1m_tokens']:.4f} per 1M tokens" if c.get("usd_per_1m_tokens") is not None else ""
        t.add_row("cost", f"${c['usd_total']:.6f} at ${c['gpu_hour_usd']}/GPU-hour{per}")
    console.print(t)
    if stats.get("per_adapter"):
        a = Table(title="per adapter", title_justify="left")
        for col in ("adapter", "requests", "errors", "prompt tok", "completion tok", "slot loads"):
            a.add_column(col, justify="left" if col == "adapter" else "right")
        for name, v in stats["per_adapter"].items():
            a.add_row(
                name,
                f"{v['requests']:,}",
                f"{v['errors']:,}",
                f"{v['prompt_tokens']:,}",
                f"{v['completion_tokens']:,}",
                str(v["slot_loads"]),
            )
        console.print(a)
