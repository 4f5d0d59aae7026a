"""Fixtures for data-parallel runs: the same tiny model + legal/medical/code adapters as the run tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def dp_model(tmp_path_factory) -> Path:
    from tests.run.conftest import build_model_dir

    return build_model_dir(tmp_path_factory.mktemp("dpmodel"))
