"""kernels/compile_log.py counts Triton's compiles and cache loads; the kernels' cache keys are stable across
processes, so a warm Triton cache serves a later run without compiling (cold start, issue 36)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multilora_cli.kernels.compile_log import CompileLog, compile_log

REPO = Path(__file__).resolve().parents[2]


def test_counts_split_compiles_from_loads_between_snapshots():
    log = CompileLog(supported=True)
    log.record("_shrink", 0.5, cache_hit=False)
    mid = log.snapshot()
    log.record("_expand", 0.25, cache_hit=False)
    log.record("_shrink", 0.01, cache_hit=True)
    log.record("_expand", 0.25, cache_hit=False)
    assert log.since(None, mid) == {"compiled": 1, "compile_s": 0.5, "loaded": 0, "load_s": 0.0, "kernels": ["_shrink"]}
    assert log.since(mid) == {"compiled": 2, "compile_s": 0.5, "loaded": 1, "load_s": 0.01, "kernels": ["_expand"]}


def test_the_listener_is_installed_in_triton_once_and_counts():
    knobs = pytest.importorskip("triton.knobs")
    log = compile_log()
    assert compile_log() is log and log.supported
    from triton.knobs import CompileTimes

    before = log.snapshot()

    class Src:
        name = "_probe_kernel"

    times = CompileTimes(ir_initialization=1000, lowering_stages=[("ttir", 2000)], store_results=0)
    knobs.compilation.listener(src=Src(), metadata={}, metadata_group={}, times=times, cache_hit=False)
    knobs.compilation.listener(src=Src(), metadata={}, metadata_group={}, times=times, cache_hit=True)
    got = log.since(before)
    assert (got["compiled"], got["loaded"], got["kernels"]) == (1, 1, ["_probe_kernel"])
    assert got["compile_s"] == pytest.approx(0.003)


KEYS = """
import importlib, json, pkgutil
import multilora_cli.kernels as K
from triton.runtime.jit import JITFunction
keys = {}
for m in pkgutil.iter_modules(K.__path__):
    mod = importlib.import_module("multilora_cli.kernels." + m.name)
    for n, v in vars(mod).items():
        if isinstance(v, JITFunction) and v.__module__ == mod.__name__:
            keys[m.name + "." + n] = v.cache_key
print(json.dumps(keys))
"""


def test_kernel_cache_keys_are_the_same_in_every_process():
    """Triton's disk cache is keyed on each kernel's cache_key (its source, the JIT functions it calls and the
    globals it reads) plus the launch's specialisation: a key that changed between processes (a global made
    per run) would recompile on every start."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled JITFunctions, not the interpreter
    env["PYTHONPATH"] = str(REPO)
    runs = [
        json.loads(
            subprocess.run([sys.executable, "-c", KEYS], capture_output=True, text=True, env=env, check=True).stdout
        )
        for _ in range(2)
    ]
    assert len(runs[0]) >= 20, "the kernels' JIT functions were found"
    assert runs[0] == runs[1]
