"""kernels/compile_fork.py on this host's real Triton compiler, for a Hopper target: forked children compile the
sampler's variants into a fresh cache and the parent's own warm-up then only loads them (the same cache keys).
No GPU here, so the parent too runs under the compile-only driver (the one the children use); on a GPU host
tests/kernels/test_launch_gpu.py checks the same with the CUDA driver in the parent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from multilora_cli.config import LineKind
from multilora_cli.engine.dry_sample import dry_sample
from multilora_cli.kernels.compile_fork import _CompileOnly
from multilora_cli.kernels.compile_log import compile_log
from multilora_cli.kernels.launch import _variant, collect, compile_all

driver.set_active(_CompileOnly(0, GPUTarget("cuda", 90, 32)))
kinds = frozenset({LineKind(sampled=True, top_p=True), LineKind()})
with collect() as calls:
    dry_sample(torch.zeros(1, 512, dtype=torch.float32), kinds)
log = compile_log()
before = log.snapshot()
n = compile_all(calls, processes=2)
got = log.since(before)
print(n, len({_variant(c) for c in calls}), got["compiled"], got["loaded"])
"""


def test_children_compile_and_the_parent_only_loads(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the real compiler, not the interpreter
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    if out.returncode != 0 and "ptxas" in out.stderr:
        pytest.skip("this Triton build cannot assemble for sm_90 here")
    assert out.returncode == 0, out.stderr[-2000:]
    n, distinct, compiled, loaded = map(int, out.stdout.split()[-4:])
    assert n == distinct > 1
    assert (compiled, loaded) == (0, n), f"the parent compiled {compiled} of {n} variants itself"
