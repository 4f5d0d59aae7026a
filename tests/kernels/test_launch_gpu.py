"""kernels/launch.py on a GPU: a recorded launch writes nothing, compile_all compiles the real kernels, and the
JITFunctions expose the parameter kinds its variant keys rely on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multilora_cli.kernels import add_lora, build_lora_meta
from multilora_cli.kernels.launch import _variant, collect, compile_all
from multilora_cli.kernels.reference import add_lora_reference
from tests.kernels.lora_cases import make_pool, token_slots

pytestmark = pytest.mark.gpu


def test_jit_functions_expose_parameter_kinds():
    from multilora_cli.kernels.sgmv_shrink import _shrink_kernel

    kinds = {p.name: (p.is_constexpr, p.do_not_specialize) for p in _shrink_kernel.params}
    assert kinds["tile_cap"] == (False, True) and kinds["BM"] == (True, False) and kinds["K"] == (False, False)


def test_collect_records_without_running_then_compiled_kernels_run_right():
    ts = token_slots("zipf", 77, seed=2)
    w = make_pool(512, [512, 128, 128], torch.bfloat16, device="cuda")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(77, 512, generator=g).to(torch.bfloat16).cuda()
    y = torch.randn(77, 768, generator=g).to(torch.bfloat16).cuda()
    y0 = y.clone()
    meta = build_lora_meta(ts, "cuda")
    with collect() as calls:
        add_lora(y, x, w, meta)
    torch.cuda.synchronize()
    assert torch.equal(y, y0), "a launch inside collect() must not run"
    assert len(calls) == 2 and len({_variant(c) for c in calls}) == 2  # the shrink and the expand
    assert compile_all(calls) == 2
    add_lora(y, x, w, meta)
    ref = add_lora_reference(y0, x, w, torch.tensor(ts))
    rel = ((y.double() - ref).norm() / (ref - y0.double()).norm()).item()
    assert rel < 1e-2


def _run_fresh(script: str, tmp_path: Path) -> str:
    """`script` in a fresh Python process with an empty Triton cache under tmp_path; its stdout."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


LAUNCHERS_BUILT_AHEAD = """
import os, sys, torch
from multilora_cli.kernels import add_lora, build_lora_meta
from multilora_cli.kernels.launch import collect, compile_all
from tests.kernels.lora_cases import make_pool, token_slots
ts = token_slots("zipf", 33, seed=1)
w = make_pool(256, [256, 64], torch.float16, device="cuda")
x, y = torch.randn(33, 256).half().cuda(), torch.randn(33, 320).half().cuda()
meta = build_lora_meta(ts, "cuda")
with collect() as calls:
    add_lora(y, x, w, meta)
compile_all(calls)
before = len(os.listdir(os.environ["TRITON_CACHE_DIR"]))
add_lora(y, x, w, meta)
torch.cuda.synchronize()
print(before, len(os.listdir(os.environ["TRITON_CACHE_DIR"])))
"""


def test_compile_all_builds_launchers_so_the_first_launch_builds_nothing(tmp_path):
    """In a fresh Triton cache, compile_all leaves nothing for the first real launch to build: each kernel's
    launcher (a C module per signature, built with the host's compiler) lands in the cache during compile_all,
    not at the launch (a cold demo run built 14 of them inside its steps, one after another)."""
    before, after = map(int, _run_fresh(LAUNCHERS_BUILT_AHEAD, tmp_path).split()[-2:])
    assert before > 0 and after == before, f"cache entries {before} after compile_all, {after} after the launch"
