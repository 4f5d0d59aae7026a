"""`multilora economics` end to end through cli.main: tables, --json, and one-line errors with exit codes."""

from __future__ import annotations

import json

import pytest

from multilora_cli.economics import Scenario, compute
from tests.economics.test_economics_inputs import write_stats


def test_json_has_every_assumption_and_figure(cli):
    rc, out, err = cli(
        "--tenants",
        100,
        "--model",
        "llama-2-7b",
        "--rank",
        16,
        "--targets",
        "q_proj,k_proj,v_proj,o_proj",
        "--gpu",
        "a100-80gb",
        "--gpu-hour-usd",
        1.5,
        "--popularity",
        "zipf",
        "--zipf-s",
        1.1,
        "--max-loras",
        8,
        "--json",
    )
    assert rc == 0 and err == ""
    data = json.loads(out)
    assert data["adapter"]["bytes"] == 33_554_432
    a = data["assumptions"]
    assert a["gpu_hour_usd"] == {"value": 1.5, "unit": "USD", "source": "flag", "note": a["gpu_hour_usd"]["note"]}
    assert a["gpu_memory_gb"]["source"] == "preset a100-80gb" and a["hours_per_month"]["value"] == 730
    assert a["pcie_gbs"]["value"] == 25.0 and "Gen4" in a["pcie_gbs"]["note"]
    ref = compute(
        Scenario(
            tenants=100,
            model="llama-2-7b",
            gpu="a100-80gb",
            gpu_hour_usd=1.5,
            popularity="zipf",
            zipf_s=1.1,
            max_loras=8,
        )
    ).to_dict()
    for section in ("adapter", "full_copy", "memory", "throughput", "fleet", "slots"):
        assert data[section].keys() == ref[section].keys()
        for k, v in data[section].items():
            assert v == (pytest.approx(ref[section][k]) if isinstance(v, float) else ref[section][k]), k
            assert f"{section}.{k}" in data["explanations"] or k == "shared_bound", k
    assert data["fleet"]["usd_per_month_saved"] == pytest.approx(data["fleet"]["gpus_saved"] * 1.5 * 730)
    assert "Che" in data["explanations"]["slots.hit_rate"]


def test_tables_explain_the_figures(cli):
    rc, out, err = cli("--tenants", 100, "--max-loras", 8)
    assert rc == 0 and err == ""
    for text in (
        "Assumptions",
        "32.0 MiB",
        "401.6×",
        "Slot thrash",
        "GPUs saved",
        "preset h100-sxm",
        "730 h",
        "exact for uniform",
        "100 tenants on llama-2-7b",
    ):
        assert text in out, text


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--tenants", 0], 2, "--tenants must be a positive integer, got 0"),
        (["--tenants", -3], 2, "--tenants must be a positive integer"),
        (["--tenants", 5, "--rank", 0], 2, "--rank must be a positive integer, got 0"),
        (["--tenants", 5, "--rank", -1], 2, "--rank"),
        (["--tenants", 5, "--model", "llama-9-9b"], 2, "unknown preset 'llama-9-9b'"),
        (["--tenants", 5, "--gpu", "tpu-v5"], 2, "--gpu must be one of"),
        (["--tenants", 5, "--targets", "q_proj,qkv"], 2, "unknown module 'qkv'"),
        (["--tenants", 5, "--targets", ","], 2, "--targets is empty"),
        (["--tenants", 5, "--dtype", "int8"], 2, "--dtype must be one of"),
        (["--tenants", 5, "--popularity", "pareto"], 2, "--popularity must be one of"),
        (["--tenants", 5, "--kv-reserve", 1.5], 2, "--kv-reserve must be in (0, 1)"),
        (["--tenants", 5, "--tokens-per-tenant-per-s", 0], 2, "--tokens-per-tenant-per-s must be > 0"),
        (["--tenants", 5, "--max-loras", 0], 2, "--max-loras must be a positive integer"),
        (["--tenants", 5, "--context-len", 1_000_000], 2, "does not fit the KV reserve"),
    ],
)
def test_bad_flag_values_are_usage_errors(cli, args, code, needle):
    rc, out, err = cli(*args)
    assert rc == code and out == ""
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1, err


def test_missing_tenants_is_a_click_usage_error(cli):
    rc, out, err = cli("--model", "llama-2-7b")
    assert rc == 2 and "--tenants" in err


def test_unreadable_files_exit_1(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"requests": 3}))
    cases = [
        (["--model", str(tmp_path / "empty")], "no config.json"),
        (["--model", str(tmp_path / "missing")], "does not exist"),
        (["--stats", str(tmp_path / "nope.json")], "cannot read"),
        (["--stats", str(bad_json)], "not valid JSON"),
        (["--stats", str(other)], "not a run stats file"),
        (["--adapter", str(tmp_path / "empty")], "adapter_config.json"),
    ]
    for args, needle in cases:
        rc, out, err = cli("--tenants", 5, *args)
        assert rc == 1 and out == "" and needle in err and err.count("\n") == 1, (args, err)


def test_adapter_with_rank_is_a_usage_error(cli, tiny):
    rc, _, err = cli("--tenants", 5, "--adapter", tiny["qv"], "--targets", "all")
    assert rc == 2 and "drop --rank / --targets" in err


def test_adapter_end_to_end(cli, tiny):
    rc, out, err = cli("--tenants", 5, "--adapter", tiny["qv"], "--json", "--dtype", "float32")
    assert rc == 0, err
    data = json.loads(out)
    assert data["adapter"]["bytes"] == 2 * 8 * (128 + 96) * 4
    assert data["assumptions"]["adapter"]["source"] == "adapter"


def test_tables_piped_to_a_file_are_not_folded_at_80_columns():
    # `multilora economics ... > report.txt`: rich used 80 columns off a terminal, folding every formula and
    # splitting the one-line verdict in two.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    p = subprocess.run(
        [sys.executable, "-m", "multilora_cli", "economics", "--tenants", "100"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.rstrip().splitlines()
    assert lines[-1].startswith("100 tenants on llama-2-7b") and lines[-1].endswith("/month"), lines[-3:]
    formula = next(line for line in lines if "LoRA parameters" in line)
    assert "Σ layers×r×(in+out)" in formula  # the whole formula on its row
    p = subprocess.run(
        [sys.executable, "-m", "multilora_cli", "economics", "--tenants", "100000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    last = p.stdout.rstrip().splitlines()[-1]  # the verdict is one line even past the table width
    assert last.startswith("100,000 tenants on") and last.endswith("/month"), p.stdout[-400:]


def test_adapter_whose_base_is_gone_says_where_the_path_came_from(cli, tiny, tmp_path):
    import shutil

    moved = tmp_path / "qv"
    shutil.copytree(tiny["qv"], moved)
    cfg = json.loads((moved / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(cfg))
    rc, out, err = cli("--tenants", 5, "--adapter", moved)
    assert rc == 1 and out == ""
    assert "base_model_name_or_path of --adapter" in err and "pass --model" in err, err


def _stats_file(path, **kw):
    return str(write_stats(path, usd=None, **kw))


def test_cpu_stats_of_a_tiny_model_do_not_size_the_fleet(cli, tiny, tmp_path):
    # `cd demo && multilora economics --tenants 100 --stats stats.json`: a CPU run of a tiny model sized the
    # llama-2-7b fleet (2 -> 3 shared GPUs) with a "measured / roofline" ratio, and warned on stdout
    stats = _stats_file(
        tmp_path / "stats.json", model=str(tiny["base"]), device="cpu", dtype="float32", wall_seconds=64.0
    )  # 102,400 tokens in 64 s: 1,600 tok/s
    rc, plain, err = cli("--tenants", 100)
    assert rc == 0 and err == ""
    rc, out, err = cli("--tenants", 100, "--stats", stats)
    assert rc == 0
    assert out.splitlines()[-1] == plain.splitlines()[-1]  # same verdict as without --stats
    assert "warning:" not in out and "measured / roofline" not in out
    assert "1,600" in out  # the measured figure is still shown, for reference
    assert "tok/s used for sizing" in out and "roofline (--stats not comparable)" in out
    assert err.startswith("warning: --stats: measured on cpu with ") and err.count("\n") == 1, err
    assert "not comparable to llama-2-7b (bfloat16) on h100-sxm" in err and "sizing from the roofline" in err
    assert "cpu is not a CUDA GPU" in err and "another model shape" in err
    rc, js, err_json = cli("--tenants", 100, "--stats", stats, "--json")
    data = json.loads(js)  # stdout stays pure JSON; the warning is in it and on stderr
    assert data["warnings"] == [err.removeprefix("warning: ").rstrip("\n")] and err_json == err
    ref = json.loads(cli("--tenants", 100, "--json")[1])
    assert data["fleet"]["shared_gpus"] == ref["fleet"]["shared_gpus"]
    assert data["throughput"]["tokens_per_s"] == ref["throughput"]["tokens_per_s"]
    assert data["slots"]["measured_hit_rate"] == pytest.approx(0.25)  # the run's slot figures are kept


def test_comparable_stats_still_size_the_fleet(cli, tmp_path):
    rc, out, err = cli("--tenants", 100, "--stats", _stats_file(tmp_path / "s.json"), "--json")
    assert rc == 0 and err == ""
    th = json.loads(out)["throughput"]
    assert th["tokens_per_s"] == th["tokens_per_s_measured"] == pytest.approx(102_400 / 40.0)
    assert th["measured_used_for_sizing"] is True and "measured_vs_roofline" in th


def test_warnings_go_to_stderr(cli):
    rc, out, err = cli("--tenants", 10, "--model", "llama-3-70b")  # needs tensor parallel: a warning
    assert rc == 0 and "warning:" not in out and "tensor parallel" in err and err.startswith("warning: ")
    assert out.splitlines()[-1].startswith("10 tenants on llama-3-70b")


def test_paths_that_look_like_rich_markup_print_as_typed(cli, tiny, tmp_path, monkeypatch):
    # Paths reach the tables and the verdict: "[bold]" vanished from them, "[/b]" was an internal MarkupError.
    import shutil

    monkeypatch.setenv("COLUMNS", "1000")  # no folding of the long tmp paths

    base = tmp_path / "m[" / "b]" / "base"
    adapter = tmp_path / "a[bold]x"
    shutil.copytree(tiny["base"], base)
    shutil.copytree(tiny["qv"], adapter)
    rc, out, err = cli("--tenants", 5, "--model", base, "--adapter", adapter)
    assert rc == 0, err
    assert str(adapter) in out and out.rstrip().splitlines()[-1].startswith(f"5 tenants on {base} with"), out


def test_home_of_a_user_that_does_not_exist_is_a_missing_path(cli, tmp_path):
    # Path("~nosuchuser-ml/x").expanduser() raises RuntimeError: each was an internal error
    for flag in ("--model", "--adapter", "--stats"):
        rc, out, err = cli("--tenants", 5, flag, "~nosuchuser-ml/x")
        assert rc in (1, 2) and out == "" and "internal error" not in err and "~nosuchuser-ml/x" in err, (flag, err)
    stats = _stats_file(tmp_path / "s.json", model="~nosuchuser-ml/llama")  # only compared by name
    rc, out, err = cli("--tenants", 5, "--stats", stats)
    assert rc == 0 and "'llama' is another name" in err, err


def test_adapter_given_as_model_is_pointed_at_the_adapter_flag(cli, tiny):
    # the hint was run's: "pass it with --adapters", a flag economics does not have
    rc, out, err = cli("--tenants", 5, "--model", tiny["qv"])
    assert rc == 1 and out == "" and "not a base model" in err and "--adapters" not in err
    assert f"--adapter {tiny['qv']}" in err, err
