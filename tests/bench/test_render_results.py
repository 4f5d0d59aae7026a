"""benchmarks.render_results: RESULTS.md's figures are drawn from the raw reports it cites, committed beside
it and linked from it."""

from __future__ import annotations

from pathlib import Path

from benchmarks.render_results import FIGURES, FIGURES_DIR, RESULTS_DIR, main
from tests.plot.files import svg_size

RESULTS_MD = Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md"


def test_every_figure_renders_from_a_cited_report_and_is_linked(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / f.svg) for f in FIGURES]
    text = RESULTS_MD.read_text()
    assert len(text.splitlines()) < 200
    for f in FIGURES:
        assert (RESULTS_DIR / f.report).exists() and f.report in text, f.report  # the report RESULTS.md cites
        assert f"(figures/{f.svg})" in text, f.svg  # linked beside its table
        assert svg_size((tmp_path / f.svg).read_bytes()) == ("864pt", "468pt")
        assert svg_size((FIGURES_DIR / f.svg).read_bytes()) == ("864pt", "468pt")  # committed
