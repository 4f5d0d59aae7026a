"""`multilora economics --plot` and the sparklines under the tables: the curves are the reports' own numbers (as
`--json` prints them at each tenant count), the files are valid PNG / SVG of the stated size and identical on a
second render, and a plot that cannot be made fails in one line before any work."""

from __future__ import annotations

import json

import pytest

from multilora_cli.economics import Scenario, analyze, resolve
from multilora_cli.economics.curves import SERIES, tenant_curves
from multilora_cli.economics.units import n, pct, usd
from tests.plot.files import EXTRA_MESSAGE, drawn_lines, png_size, run_without_matplotlib, svg_size

FLAGS = ("--popularity", "zipf", "--zipf-s", 1.1, "--max-loras", 8)
GIVEN = 40


@pytest.fixture(scope="module")
def curves():
    r = resolve(Scenario(tenants=GIVEN, popularity="zipf", zipf_s=1.1, max_loras=8))
    report = analyze(r)
    return tenant_curves(r, report), report


def _same(curve_value, json_value) -> bool:
    return curve_value == (pytest.approx(json_value) if isinstance(json_value, float) else json_value)


def test_plotted_series_equal_the_json_reports(cli, curves, tmp_path):
    c, report = curves
    assert c.tenants[0] == 1 and c.tenants[-1] == 10 * GIVEN and GIVEN in c.tenants and len(c.tenants) <= 26
    assert list(c.tenants) == sorted(set(c.tenants)) and c.max_loras == 8
    rc, out, err = cli("--tenants", GIVEN, *FLAGS, "--json", "--plot", tmp_path / "e.svg")
    assert rc == 0 and err == "" and (tmp_path / "e.svg").exists()
    data = json.loads(out)  # --plot leaves --json as it was: one object on stdout
    for name, (section, key) in SERIES.items():
        assert _same(c.at(name, GIVEN), data[section][key]), name
    # every other point is the report `--tenants T` prints, with the same slots
    for t in (c.tenants[0], c.tenants[len(c.tenants) // 3], c.tenants[-1]):
        rc, out, _ = cli("--tenants", t, *FLAGS, "--json")
        point = json.loads(out)
        for name, (section, key) in SERIES.items():
            assert _same(c.at(name, t), point[section][key]), (t, name)
    # the right axis reads $/month off the GPU lines: the report's $/month is GPUs x one price at every point
    per_gpu = c.usd_per_month_shared[0] / c.shared_gpus[0]
    for key in ("dedicated", "shared"):
        month, gpus = getattr(c, f"usd_per_month_{key}"), getattr(c, f"{key}_gpus")
        assert [m for m in month] == pytest.approx([g * per_gpu for g in gpus])


def test_the_figure_draws_exactly_the_curves(curves):
    from multilora_cli.plot.canvas import style
    from multilora_cli.plot.economics import SIZE, economics_figure

    c, report = curves
    with style():
        fig = economics_figure(c, report)
        lines = drawn_lines(fig)
        assert tuple(fig.get_size_inches()) == SIZE
    for name in ("dedicated_gpus", "shared_gpus", "hit_rate", "loads_per_step", "max_loads_per_step_pcie"):
        x, y = lines[name]
        assert x == list(c.tenants) and y == list(getattr(c, name)), name
        if name != "max_loads_per_step_pcie":  # the given point is marked on every curve but the limit
            assert lines[f"given:{name}"] == ([GIVEN], [c.at(name, GIVEN)]), name
    captions = "\n".join(t.get_text() for t in fig.texts)
    for a in report.assumptions:  # every assumption is in the caption (labels may wrap: compare word by word)
        assert a.label.split()[0] in captions and a.source in captions, a.key
    assert report.summary.split()[0] in captions


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_file_has_the_stated_size_and_is_identical_on_a_second_render(cli, tmp_path, suffix):
    path = tmp_path / f"fleet.{suffix}"
    rc, out, err = cli("--tenants", GIVEN, *FLAGS, "--plot", path)
    assert rc == 0 and err == "", err
    first = path.read_bytes()
    if suffix == "png":
        assert png_size(first) == (1200, 850)  # SIZE 12 x 8.5 in at 100 dpi
    else:
        assert svg_size(first) == ("864pt", "612pt")
        assert b"<dc:date>" not in first
    path.unlink()
    assert cli("--tenants", GIVEN, *FLAGS, "--plot", path)[0] == 0
    assert path.read_bytes() == first


def test_terminal_view_has_one_line_per_curve_above_the_summary(cli, curves):
    c, report = curves
    rc, out, err = cli("--tenants", GIVEN, *FLAGS)
    assert rc == 0
    lines = out.splitlines()
    assert lines[-1] == report.summary  # still the last line
    g = c.given_index
    expected = {
        "dedicated GPUs": (c.dedicated_gpus, n),
        "shared GPUs": (c.shared_gpus, n),
        "dedicated $/month": (c.usd_per_month_dedicated, usd),
        "shared $/month": (c.usd_per_month_shared, usd),
        "slot hit rate": (c.hit_rate, pct),
        "slot loads per step": (c.loads_per_step, n),
        "host->GPU limit, loads": (c.max_loads_per_step_pcie, n),
    }
    for label, (values, fmt) in expected.items():
        line = next(x for x in lines if x.startswith(label + " "))
        spark = line[len(label) :].split()[0]
        assert len(spark) == len(c.tenants) and set(spark) <= set("▁▂▃▄▅▆▇█"), line
        assert line.endswith(f"{fmt(values[0])} → {fmt(values[g])} → {fmt(values[-1])}"), line
    assert any(x.startswith(f"Over tenants 1 → {GIVEN} (given, highlighted) → {n(10 * GIVEN)}") for x in lines)


def test_json_alone_draws_nothing_and_prints_no_sparklines(cli):
    rc, out, _ = cli("--tenants", GIVEN, "--json")
    assert rc == 0 and "▁" not in out and json.loads(out)["slots"]["max_loads_per_step_pcie"] > 0


def test_unwritable_plot_is_one_line_exit_1_before_any_work(cli, tmp_path):
    # the model does not exist either: the plot is checked first, as run checks its outputs before the model
    rc, out, err = cli("--tenants", 5, "--model", tmp_path / "no-model", "--plot", tmp_path / "missing" / "e.png")
    assert rc == 1 and out == ""
    assert (
        err
        == f"error: cannot write plot {tmp_path / 'missing' / 'e.png'}: directory {tmp_path / 'missing'} does not exist\n"
    )
    (tmp_path / "d.svg").mkdir()
    rc, out, err = cli("--tenants", 5, "--plot", tmp_path / "d.svg")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "is a directory" in err
    rc, out, err = cli("--tenants", 5, "--plot", tmp_path / "e.pdf")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "must end in .png or .svg" in err


def test_without_matplotlib_plot_names_the_extra_and_tables_still_work(tmp_path):
    p = run_without_matplotlib("economics", "--tenants", 5, "--plot", tmp_path / "e.png")
    assert (p.returncode, p.stdout, p.stderr) == (1, "", EXTRA_MESSAGE)
    assert not (tmp_path / "e.png").exists()
    p = run_without_matplotlib("economics", "--tenants", 5)
    assert p.returncode == 0 and "shared GPUs" in p.stdout, p.stderr
