"""Root hooks: tests marked `gpu` need CUDA; without it they are collected (so `pytest -m gpu` lists them on any
machine) and skipped."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
