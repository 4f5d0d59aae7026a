"""`multilora bench` flag checks through cli.main: every bad value is a one-line usage error (exit 2) naming the flag,
raised before any model is built or any device is looked at."""

from __future__ import annotations

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


@pytest.mark.parametrize("args,needle", [
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
])
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
