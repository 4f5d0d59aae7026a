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


@pytest.fixture(autouse=True)
def _free_engines():
    """Engines hold a KV cache (1 GiB on CPU by default) and sit in reference cycles (runner <-> model hooks,
    threads' closures): collect them after each test, or a whole-suite run keeps dozens alive and outgrows a
    24 GB CI machine."""
    yield
    import gc

    gc.collect()
