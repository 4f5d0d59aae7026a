"""Fixtures for the economics tests: a CLI runner and a tiny real base model + PEFT adapters."""

from __future__ import annotations

import pytest

from tests import builders


@pytest.fixture
def cli(capsys):
    """Run `multilora ARGS...` through cli.main; return (exit code, stdout, stderr)."""
    from multilora_cli.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(["economics", *map(str, args)])
        out, err = capsys.readouterr()
        return exc.value.code, out, err

    return run


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny Llama (hidden 64, 2 layers, 4 heads / 2 kv heads) and real PEFT adapters on it."""
    root = tmp_path_factory.mktemp("econ")
    base = builders.build_base(root / "base", "llama")
    return {
        "base": base,
        "qv": builders.build_adapter(base, root / "qv", r=8, targets=("q_proj", "v_proj")),
        "pattern": builders.build_adapter(
            base, root / "pattern", r=8, targets="all-linear", rank_pattern={"down_proj": 4}
        ),
    }
