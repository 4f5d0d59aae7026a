"""`multilora bench --plot` from a report (a committed H200 run with base, adapter, zipf and HF rows): the bars
and the base line are the report's numbers, the SVG has the stated size and the same bytes every time, and a
plot that cannot be made fails in one line before any row runs. The CPU run itself: test_bench_cpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multilora_cli.bench.series import bench_series
from tests.plot.files import EXTRA_MESSAGE, drawn_bars, drawn_lines, run_without_matplotlib, svg_size

REPORT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "e2e-h200-run47.json"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(REPORT.read_text())


@pytest.fixture
def bench(capsys):
    from multilora_cli.cli import main

    def run(*args) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(["bench", *map(str, args)])
        out, err = capsys.readouterr()
        return exc.value.code, out, err

    return run


def test_series_are_the_report_rows(report):
    s = bench_series(report)
    rows = report["rows"]
    assert [b.tokens_per_s for b in s.rows] == [r["tokens_per_s"] for r in rows if r["system"] != "multilora-base"]
    assert [b.spec for b in s.rows] == ["64/64", "64/64z", "8/8", "1/1", "256/64", "256/256", "hf64"]
    assert s.base.tokens_per_s == next(r["tokens_per_s"] for r in rows if r["system"] == "multilora-base")
    with_roof = [r for r in rows if r["roofline_ms"] is not None]
    assert [(b.decode_step_ms, b.roofline_ms) for b in s.step_rows] == [
        (r["decode_step_ms"], r["roofline_ms"]) for r in with_roof
    ]
    assert s.step_rows[0].spec == "base" and "hf64" not in [b.spec for b in s.step_rows]


def test_the_figure_draws_exactly_the_series(report):
    from multilora_cli.plot.bench import SIZE, bench_figure
    from multilora_cli.plot.canvas import style

    s = bench_series(report)
    with style():
        fig = bench_figure(s)
    tokens_ax, steps_ax = fig.axes
    assert tuple(fig.get_size_inches()) == SIZE
    assert [h for _, h in drawn_bars(tokens_ax)["tokens_per_s"]] == [b.tokens_per_s for b in s.rows]
    assert drawn_lines(fig)["base_tokens_per_s"][1] == [s.base.tokens_per_s] * 2
    bars = drawn_bars(steps_ax)
    for b, (_, low), (bottom, above) in zip(s.step_rows, bars["roofline_ms"], bars["above_roofline_ms"]):
        assert low == b.roofline_ms and bottom == low  # every row here runs above its roofline
        assert bottom + above == pytest.approx(b.decode_step_ms, rel=1e-12)
    assert drawn_lines(fig)["roofline_ms"][1] == [b.roofline_ms for b in s.step_rows]


def test_svg_has_the_stated_size_and_the_same_bytes_twice(report):
    from multilora_cli.plot.bench import render_bench

    s = bench_series(report)
    first = render_bench(s, "svg")
    assert svg_size(first) == ("864pt", "468pt") and first == render_bench(s, "svg")
    assert render_bench(s, "png") == render_bench(s, "png")


def test_a_report_without_rows_still_draws():
    from multilora_cli.plot.bench import render_bench

    empty = {"device": {"name": "cpu"}, "rows": [], "failed": [], "not_run": []}
    assert svg_size(render_bench(bench_series(empty), "svg")) == ("864pt", "468pt")


def test_unwritable_plot_fails_before_any_row(bench, tmp_path):
    rc, out, err = bench("--device", "cpu", "--preset", "tiny", "--plot", tmp_path / "no" / "b.png")
    assert (
        rc == 1
        and out == ""
        and err
        == (f"error: cannot write plot {tmp_path / 'no' / 'b.png'}: directory {tmp_path / 'no'} does not exist\n")
    )
    rc, _, err = bench(
        "--device", "cpu", "--preset", "tiny", "--plot", tmp_path / "b.png", "--json", tmp_path / "b.png"
    )
    assert rc == 2 and "same file" in err


def test_without_matplotlib_bench_plot_names_the_extra_before_any_row(tmp_path):
    p = run_without_matplotlib("bench", "--device", "cpu", "--preset", "tiny", "--plot", tmp_path / "b.svg")
    assert (p.returncode, p.stdout, p.stderr) == (1, "", EXTRA_MESSAGE)  # no "device cpu: ..." line: nothing ran
