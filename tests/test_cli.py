"""The CLI shell: help, version, and the one place errors become a message and an exit code (cli.main)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from multilora_cli import __version__
from multilora_cli.cli import main, report
from multilora_cli.errors import EXIT_FATAL, EXIT_USAGE, ConfigError, OutputError

COMMANDS = ("run", "inspect", "economics", "demo", "bench")


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run cli.main(argv) in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    code = e.value.code
    return (0 if code is None else code), out, err


def test_help_lists_every_command(capsys):
    code, out, _ = call(["--help"], capsys)
    assert code == 0
    for name in COMMANDS:
        assert name in out
    code, out, _ = call(["demo", "--help"], capsys)
    assert code == 0 and "--force" in out


def test_version(capsys):
    code, out, _ = call(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"multilora {__version__}"


def test_version_through_python_dash_m():
    p = subprocess.run(
        [sys.executable, "-m", "multilora_cli", "--version"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"multilora {__version__}"


def test_unknown_flag_is_a_usage_error(capsys):
    code, _, err = call(["demo", "--no-such-flag"], capsys)
    assert code == EXIT_USAGE
    assert "--no-such-flag" in err


def test_multilora_error_is_one_line_and_its_exit_code(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MULTILORA_DEBUG", raising=False)
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    code, out, err = call(["demo", str(not_a_dir)], capsys)  # a real OutputError from `multilora demo`
    assert code == OutputError.exit_code == EXIT_FATAL
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and str(not_a_dir) in lines[0] and "not a directory" in lines[0]
    assert "Traceback" not in err and out == ""


def test_report_uses_the_error_class_exit_code_and_hint(capsys, monkeypatch):
    monkeypatch.delenv("MULTILORA_DEBUG", raising=False)
    rc = report(ConfigError("max_loras must be >= 1, got 0", hint="pass --max-loras 1 or more"))
    _, err = capsys.readouterr()
    assert rc == EXIT_USAGE
    assert err == "error: max_loras must be >= 1, got 0 (pass --max-loras 1 or more)\n"


def _break_demo(monkeypatch, exc: BaseException) -> None:
    # Fault injection: make the real `multilora demo` hit an unexpected exception (a bug, as users would see it).
    import multilora_cli.demo.build as build

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(build, "is_demo", boom)


def test_unexpected_error_shows_the_debug_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MULTILORA_DEBUG", raising=False)
    _break_demo(monkeypatch, RuntimeError("kaboom"))
    code, _, err = call(["demo", str(tmp_path / "d")], capsys)
    assert code == EXIT_FATAL
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error: RuntimeError: kaboom" in lines[0]
    assert "MULTILORA_DEBUG=1" in lines[0]
    assert "Traceback" not in err


def test_debug_env_shows_the_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MULTILORA_DEBUG", "1")
    _break_demo(monkeypatch, RuntimeError("kaboom"))
    code, _, err = call(["demo", str(tmp_path / "d")], capsys)
    assert code == EXIT_FATAL
    assert "Traceback (most recent call last)" in err and "boom" in err
    assert err.strip().splitlines()[-1] == "error: internal error: RuntimeError: kaboom"


def test_debug_env_also_traces_multilora_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MULTILORA_DEBUG", "1")
    _break_demo(monkeypatch, OutputError("cannot write here"))
    code, _, err = call(["demo", str(tmp_path / "d")], capsys)
    assert code == EXIT_FATAL
    assert "Traceback" in err
    assert err.strip().splitlines()[-1] == "error: cannot write here"


def test_keyboard_interrupt_exits_130(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MULTILORA_DEBUG", raising=False)
    _break_demo(monkeypatch, KeyboardInterrupt())
    code, _, err = call(["demo", str(tmp_path / "d")], capsys)
    assert code == 130
    assert err.strip() == "error: interrupted"


def _help_entries(out: str) -> dict[str, str]:
    """click's plain help -> {each flag name: its whole entry, continuation lines joined}."""
    entries: dict[str, str] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if re.match(r"^  (-\w, )?--\w", line):
            current = [line.strip()]
            for name in re.findall(r"--[\w-]+", line.split("  ")[1] if line.startswith("  -") else line):
                entries[name] = current  # type: ignore[assignment]
        elif current is not None and line.startswith("    "):
            current.append(line.strip())
        else:
            current = None
    return {k: " ".join(v) for k, v in entries.items()}


@pytest.mark.parametrize("columns", ["200", "80"])
def test_run_help_shows_flags_as_flags_and_states_defaults(capsys, monkeypatch, columns):
    # typer renders a bool option as "<bool>" unless it has a metavar: `--resume <bool>` reads as if it took a
    # value (and `--resume true` is then rejected). The contract's knobs also need their defaults in the help, and
    # at 80 columns every flag name stays whole (rich's panels cut --gpu-memory-utiliz…).
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = call(["run", "-h"], capsys)
    assert code == 0 and "…" not in out
    rows = _help_entries(out)
    assert "--gpu-memory-utilization" in rows and "--pinned-arena" in rows, out
    for flag in ("--resume", "--quiet"):
        assert "<bool>" not in rows[flag], rows[flag]
    for flag in (
        "--max-tokens",
        "--max-loras",
        "--max-lora-rank",
        "--max-cpu-loras",
        "--max-num-seqs",
        "--max-model-len",
        "--seed",
        "--temperature",
        "--top-p",
        "--top-k",
        "--dtype",
        "--device",
    ):
        assert "default" in rows[flag].lower(), rows[flag]
    for argv in (["inspect", "-h"], ["economics", "-h"], ["demo", "-h"], ["bench", "-h"], ["-h"]):
        code, out, _ = call(argv, capsys)
        assert code == 0 and _help_entries(out) and "<bool>" not in out and "…" not in out, (argv, out)


def test_sigterm_is_reported_like_ctrl_c_with_exit_143(tmp_path, capsys, monkeypatch):
    import os
    import signal

    import multilora_cli.cli as cli

    monkeypatch.delenv("MULTILORA_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_terminated", False)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import multilora_cli.demo.build as build

        monkeypatch.setattr(build, "build_demo", lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM))
        code, _, err = call(["demo", str(tmp_path / "d")], capsys)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 143
    assert err.strip() == "error: terminated (SIGTERM)"


@pytest.mark.parametrize("argv,want", [([], True), (["--no-pinned-arena"], False), (["--pinned-arena"], True)])
def test_pinned_arena_flag_reaches_the_engine_config(argv, want, tmp_path, capsys, monkeypatch):
    import multilora_cli.commands.run as run_command

    seen = {}
    monkeypatch.setattr(run_command, "run_job", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    call(["run", "in.jsonl", "--adapters", "a", *argv], capsys)
    engine = seen["cfg"].engine
    assert engine.pinned_arena is want
    assert engine.engine_config("m", max_loras=1, max_lora_rank=8, seed=None).pinned_arena is want
