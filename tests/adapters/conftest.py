"""Shared fixtures: tiny bases and PEFT-written adapters, built once per session (tmp_path_factory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.fake_hub import serving
from tests.adapters.zoo import Zoo


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("adapters-zoo"))


@pytest.fixture(scope="session")
def llama_base(zoo) -> Path:
    return zoo.base("llama", "llama")


@pytest.fixture(scope="session")
def qwen2_base(zoo) -> Path:
    return zoo.base("qwen2", "qwen2")


@pytest.fixture(scope="session")
def good_adapter(zoo, llama_base) -> Path:
    """A plain rank-8 q/v LoRA on the tiny llama."""
    return zoo.adapter("good", llama_base, r=8, alpha=16, targets=("q_proj", "v_proj"))


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `multilora ARGV` through cli.main (which maps errors to messages and exit codes) -> (rc, out, err)."""
    from multilora_cli.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when not on a terminal

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return exc.value.code, out, err

    return run


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """The Hub client talks to tests/adapters/fake_hub.py's FakeHub on loopback."""
    with serving(monkeypatch, tmp_path):
        yield
