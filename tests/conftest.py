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
def _isolate_process_state(request):
    """After each test: collect garbage, and put SIGINT / SIGTERM back as they were.

    Engines hold a KV cache (1 GiB on CPU by default) and sit in reference cycles (runner <-> model hooks,
    threads' closures): without a collection a whole-suite run keeps dozens alive and outgrows a 24 GB CI machine.
    A test that drives the CLI in-process may leave a handler changed (cli.py installs SIGTERM's; after a Ctrl-C
    io/terminal.stop_on_next_signal ignores SIGINT through the cleanup): a subprocess started later inherits an
    ignored SIGINT and misses its own Ctrl-C (tests/run/test_run_shell.py failed so in whole-suite runs)."""
    import gc
    import signal
    import warnings

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    gc.collect()
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
            if sig == signal.SIGINT:
                warnings.warn(f"{request.node.nodeid} changed the SIGINT handler (restored)", stacklevel=1)
