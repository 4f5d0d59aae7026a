"""Render RESULTS.md's figures from the raw reports it cites, into benchmarks/figures/ (committed beside the
tables, linked from RESULTS.md).

    python -m benchmarks.render_results              # rewrite benchmarks/figures/*.svg
    python -m benchmarks.render_results --out DIR    # elsewhere (tests)

Each figure is drawn by the library `multilora bench --plot` uses (multilora_cli/plot/bench.py) from a
`bench_e2e` / `multilora bench --json` report, so the pictures and the tables read the same rows. When RESULTS.md
moves to a newer run, point FIGURES at its report and rerun this. Needs matplotlib (`pip install -e '.[plot]'`);
no GPU, no torch import. The same matplotlib gives byte-identical files (multilora_cli/plot/canvas.py).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
FIGURES_DIR = HERE / "figures"


@dataclass(slots=True, frozen=True)
class ResultFigure:
    """One figure of RESULTS.md: the raw report it is drawn from, the SVG it becomes, its title."""

    report: str  # file name under benchmarks/results/
    title: str

    @property
    def svg(self) -> str:
        return self.report.removesuffix(".json") + ".svg"


FIGURES = (
    ResultFigure(
        "e2e-h200-run49.json",
        "End to end, run 49 (one H200, Llama-3-8B shapes, rank 16, 1,024 requests of 128 + 128 tokens): "
        "adapters vs base only",
    ),
    ResultFigure(
        "e2e-h200-run48-slots.json",
        "GPU slots, run 48 (one H200, Llama-3-8B shapes): 64 adapters in 64 / 8 / 16 slots, 8 adapters in 8 / 64, zipf",
    ),
)


def render(out_dir: Path = FIGURES_DIR) -> list[Path]:
    """Write every figure of FIGURES as SVG under `out_dir`; returns the paths written."""
    from multilora_cli.bench.series import bench_series
    from multilora_cli.plot.bench import render_bench
    from multilora_cli.plot.target import require_matplotlib

    require_matplotlib()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fig in FIGURES:
        report = json.loads((RESULTS_DIR / fig.report).read_text())
        path = out_dir / fig.svg
        path.write_bytes(render_bench(bench_series(report), "svg", title=fig.title))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=FIGURES_DIR, help="folder for the SVGs (default benchmarks/figures)")
    args = p.parse_args(argv)
    for path in render(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
