"""`multilora bench` flag checks through cli.main: every bad value is a one-line usage error (exit 2) naming the flag,
raised before any model is built or any device is looked at."""

from __future__ import annotations

import json

import pytest

from multilora_cli.errors import ConfigError


@pytest.fixture
def bench(capsys):
    """Run `multilora bench ARGS...` through cli.main; return (exit code, stdout, stderr)."""
    from multilora_cli.cli import main

    def run(*args) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(["bench", *map(str, args)])
        out, err = capsys.readouterr()
        return exc.value.code, out, err

    return run


@pytest.mark.parametrize(
    "args,needle",
    [
        # 0 slots used to be read as "unset" and ran with 64
        (["--max-loras", 0], "--max-loras must be >= 1"),
        (["--max-loras", -2, "--device", "cpu", "--preset", "tiny"], "--max-loras must be >= 1"),
        # an unknown preset used to get "no GPU here: a foo benchmark on CPU would take hours"
        (["--preset", "foo", "--device", "cpu"], "--preset 'foo' is not a known model shape"),
        (["--preset", "foo"], "--preset 'foo' is not a known model shape"),
        # field names (num_requests, output_len, prompt_len) used to stand where the flags should
        (["--requests", 0, "--device", "cpu", "--preset", "tiny"], "--requests must be >= 1, got 0"),
        (["-n", -1], "--requests must be >= 1, got -1"),
        (["--output-len", 0, "--device", "cpu", "--preset", "tiny"], "--output-len must be >= 1, got 0"),
        (["--prompt-len", 0, "--device", "cpu", "--preset", "tiny"], "--prompt-len must be >= 1, got 0"),
        (["--rank", 0], "--rank must be >= 1"),
        (["--max-num-seqs", 0], "--max-num-seqs must be >= 1"),
        (["--distribution", "pareto"], "--distribution must be one of uniform, zipf"),
        (["--temperature", -1], "--temperature must be"),
        (["--temperature", 0.5, "--top-p", 0], "--top-p must be"),
        (["--device", "tpu"], "--device must be auto, cuda or cpu"),
        (["--rows", "64/0", "--device", "cpu", "--preset", "tiny"], "bad benchmark row '64/0': 0 slots"),
        # NaN and inf used to get through (NaN passes every comparison): a bench of NaN sampling, or Workload's words
        (["--temperature", "nan"], "--temperature must be a finite number, got nan"),
        (["--temperature", "inf"], "--temperature must be a finite number, got inf"),
        (["--temperature", 0.5, "--top-p", "nan"], "--top-p must be a finite number, got nan"),
        (["--top-p", "inf"], "--top-p must be a finite number, got inf"),
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(bench, args, needle):
    rc, out, err = bench(*args)
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1, err
    for field in ("num_requests", "output_len", "prompt_len", "max_loras", "max_num_seqs", "top_p"):
        assert field not in err, err


def test_unknown_preset_lists_the_valid_ones(bench):
    rc, _, err = bench("--preset", "foo", "--device", "cpu")
    assert rc == 2 and "no GPU here" not in err
    for name in ("tiny", "llama-3-8b", "llama-2-7b", "mistral-7b", "qwen2.5-7b"):
        assert name in err, err


def test_known_preset_on_cpu_still_points_at_tiny(bench):
    rc, _, err = bench("--preset", "LLaMA-3-8B", "--device", "cpu")
    assert rc == 2 and "no GPU here" in err and "--preset tiny" in err


def test_workload_maps_every_flagged_field():
    from multilora_cli.bench.workload import FLAGS, Workload

    # the one table errors go through: each entry is a real Workload field
    assert set(FLAGS) <= set(Workload.__dataclass_fields__)
    with pytest.raises(ConfigError, match="^--max-loras must be >= 1"):
        Workload(max_loras=0)


# small enough that, where a check is missing, the bench this would start instead is seconds on CPU
SMALL = [
    "--device",
    "cpu",
    "--preset",
    "tiny",
    "-n",
    2,
    "--prompt-len",
    4,
    "--output-len",
    2,
    "--max-num-seqs",
    2,
    "--num-adapters",
    1,
]


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--num-adapters", 8], "--num-adapters"),
        (["--num-adapters", "8,64"], "--num-adapters"),
        (["--distribution", "zipf"], "--distribution"),
        (["--max-loras", 4], "--max-loras"),
        (["--base"], "--base/--no-base"),
        (["--no-base"], "--base/--no-base"),
        (["--hf"], "--hf/--no-hf"),
        (["--no-hf"], "--hf/--no-hf"),
    ],
)
def test_rows_beside_a_flag_it_overrides_is_a_usage_error(bench, flags, named):
    # these flags used to be dropped without a word: `--rows 64 --distribution zipf` ran a uniform row
    rc, out, err = bench("--rows", "64", *flags, "--device", "cpu")
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("error: --rows sets ") and f"drop {named} (" in err and err.count("\n") == 1, err
    assert "no GPU here" not in err


def test_adapter_counts_are_num_adapters_not_a(bench):
    # `run -a` takes adapter names: bench's counts have a long flag of their own and no short one
    rc, out, err = bench("-a", 8, "--device", "cpu")
    assert rc == 2 and out == "" and "No such option: -a" in err, (rc, out, err)
    rc, out, err = bench("--num-adapters", "8,x", "--device", "cpu", "--preset", "tiny")
    assert rc == 2 and err == "error: --num-adapters takes counts like 8,64; got 'x'\n", (rc, out, err)


def test_rows_names_every_overridden_flag_and_leaves_the_others_alone(bench):
    flags = ["--max-loras", 8, "--num-adapters", 64, "--no-hf", "--distribution", "uniform", "--device", "cpu"]
    rc, _, err = bench("--rows", "64,base", *flags)
    assert rc == 2 and "drop --num-adapters, --distribution, --max-loras, --hf/--no-hf (" in err, err
    # flags every row shares still go with --rows: past the check, to the CPU refusal of an 8B shape
    rc, _, err = bench(
        "--rows", "64,base", "--rank", 8, "-n", 4, "--prompt-len", 8, "--temperature", 0.5, "--device", "cpu"
    )
    assert rc == 2 and "no GPU here" in err and "--rows" not in err, err


@pytest.mark.parametrize("preset,positions", [("tiny", 2048), ("llama-2-7b", 4096), ("llama-3-8b", 8192)])
def test_prompt_and_output_above_the_shapes_positions_is_a_usage_error(bench, preset, positions):
    # it used to start the bench and fail every row at engine start (max_model_len above max_position_embeddings)
    rc, out, err = bench(*SMALL, "--preset", preset, "--prompt-len", positions - 9, "--output-len", 10)
    assert rc == 2 and out == "", (rc, out, err)
    assert err == (
        f"error: --prompt-len {positions - 9} + --output-len 10 exceed the {preset} shape's {positions} positions\n"
    ), err
    if preset != "tiny":  # exactly the shape's positions is fine: on to the CPU refusal of a full-size shape
        rc, _, err = bench(*SMALL, "--preset", preset, "--prompt-len", positions - 10, "--output-len", 10)
        assert rc == 2 and "no GPU here" in err, err


@pytest.mark.parametrize("preset,hidden", [("tiny", 64), ("llama-3-8b", 4096)])
def test_rank_above_the_shapes_hidden_size_is_a_usage_error(bench, preset, hidden):
    # it used to build every adapter at that rank (all cost, no effect: a delta's rank is <= min(in, out))
    rc, out, err = bench(*SMALL, "--preset", preset, "--rank", hidden + 1)
    assert rc == 2 and out == "", (rc, out, err)
    assert err == f"error: --rank {hidden + 1} is above the {preset} shape's hidden size {hidden}\n", err
    if preset != "tiny":
        rc, _, err = bench(*SMALL, "--preset", preset, "--rank", hidden)
        assert rc == 2 and "no GPU here" in err, err


def test_unwritable_json_fails_before_the_run(bench, tmp_path):
    # it used to run every row, then fail writing (an internal error, exit 1) with the measurements lost
    rc, out, err = bench(*SMALL, "--json", tmp_path)
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err.startswith(f"error: --json {tmp_path} is a directory (") and err.count("\n") == 1, err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, out, err = bench(*SMALL, "--json", blocker / "b.json")
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err.startswith(f"error: --json {blocker / 'b.json'} cannot be written: ") and err.count("\n") == 1, err
    assert "copy bandwidth" not in err  # no row started (the suite's first log line)
    # the probe leaves what it found: an existing file keeps its bytes, a new one is not left behind empty
    # (its folders are made, as write_json would); the run stops at the next check, the 8B shape on CPU
    kept = tmp_path / "kept.json"
    kept.write_text("keep")
    for path in (kept, tmp_path / "new" / "dir" / "b.json"):
        rc, _, err = bench("--device", "cpu", "--json", path)
        assert rc == 2 and "no GPU here" in err, err
    assert kept.read_text() == "keep"
    assert (tmp_path / "new" / "dir").is_dir() and not (tmp_path / "new" / "dir" / "b.json").exists()


def test_failed_rows_exit_1_after_the_table_and_json(bench, tmp_path, monkeypatch):
    """An HF + PEFT row on a machine without peft fails for real (ModuleNotFoundError inside run_suite's try); the
    multilora row beside it runs. It used to end with exit 0, so a script saw success."""
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ModuleNotFoundError, as where it is missing
    path = tmp_path / "b.json"
    rc, out, err = bench(*SMALL[:-2], "--rows", "1,hf1", "--json", path)  # all but --num-adapters
    assert rc == 1, (rc, out, err)
    assert "| multilora | tiny | 1 |" in out and "\nFAILED hf 1 adapters: ModuleNotFoundError" in out, out
    assert err.splitlines()[-1].startswith(
        "error: 1 of 2 benchmark rows failed (first: hf 1 adapters: ModuleNotFoundError: import of peft halted"
    ), err
    report = json.loads(path.read_text())  # written before the exit: the measured row is not lost
    assert [r["system"] for r in report["rows"]] == ["multilora"]
    assert [(f["kind"], f["workload"]["num_adapters"]) for f in report["failed"]] == [("hf", 1)]
