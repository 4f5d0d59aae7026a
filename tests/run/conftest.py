"""Fixtures for `multilora run` tests: the tiny model directory of tests/run/helpers.py, built once a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.run.helpers import build_model_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("runmodel"))
