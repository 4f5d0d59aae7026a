"""kernels/launch.py on a GPU: a recorded launch writes nothing, compile_all compiles the real kernels, and the
JITFunctions expose the parameter kinds its variant keys rely on."""

from __future__ import annotations

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
