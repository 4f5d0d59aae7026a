"""Logits processing on CUDA (skipped without a GPU): the Triton processing and sampling kernels, and the token
history updated on the device while the next step is already launched (run-ahead is asynchronous only here).

fp32: greedy repetition_penalty equals transformers' generate (fp32 on CPU) token for token, and a mixed batch
where every row has other parameters gives each row what it gets alone (as tests/engine/test_engine_gpu.py
checks alone == batched in fp32 only: bf16 GEMMs may round differently at another batch size). fp32 and bf16:
the same tokens with run-ahead on and off, with decode CUDA graphs and without.
"""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.builders import build_mixed, load_peft
from tests.engine.test_engine_penalties import PLAN, hf_generate, prompts, run
from tests.engine.test_engine_processing_batch import MIXED, outcome, requests

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("gpu_processing"), "llama")


def engine(llama, **kw) -> Engine:
    base, adapters = llama
    cfg = dict(model=str(base), device="cuda", dtype="float32", max_loras=3, max_lora_rank=16, seed=11)
    return Engine(EngineConfig(**{**cfg, "max_num_seqs": 16, "num_kv_blocks": 256, **kw}), adapters)


@pytest.mark.parametrize("eager", [False, True])
def test_fp32_greedy_repetition_penalty_equals_hf_generate(llama, eager):
    ps = prompts(len(PLAN), seed=1)
    eng = engine(llama, enforce_eager=eager)
    got = run(eng, ps, PLAN, repetition_penalty=1.5, ignore_eos=True)
    eng.close()
    pm = load_peft(*llama)
    assert [r.token_ids for r in got] == [hf_generate(pm, p, a, repetition_penalty=1.5) for p, a in zip(ps, PLAN)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("eager", [False, True])
def test_mixed_parameters_alone_together_and_run_ahead(llama, dtype, eager):
    ps = prompts(len(MIXED), seed=7)
    ahead = engine(llama, dtype=dtype, enforce_eager=eager)
    together = outcome(ahead.generate_all(requests(ps, MIXED, max_tokens=24)))
    assert ahead.stats.ahead_steps > 0
    if dtype == "float32":
        alone = [outcome(ahead.generate_all(requests([p], [m], max_tokens=24)))[0] for p, m in zip(ps, MIXED)]
        assert together == alone
    ahead.close()
    step_by_step = engine(llama, dtype=dtype, enforce_eager=eager, run_ahead=False)
    assert outcome(step_by_step.generate_all(requests(ps, MIXED, max_tokens=24))) == together
    step_by_step.close()
