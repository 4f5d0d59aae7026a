"""Logprobs, prompt logprobs and scoring on CUDA (skipped without a GPU): a mixed-adapter batch with decode CUDA
graphs (the logprobs are computed outside the graph from the logits it returns) and with run-ahead steps, against
HF + PEFT in fp32 on the CPU: bf16 within 2e-2, fp32 within 1e-4, for every completion logprob (of the engine's
own tokens), the top-1 logprob, every prompt logprob and each scoring line's logprob."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.scoring import encode_pair
from tests.builders import build_mixed, load_peft

pytestmark = pytest.mark.gpu

PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None, "mlp16", "all4rs"]
TOL = {"bfloat16": 2e-2, "float32": 1e-4}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, adapters = build_mixed(tmp_path_factory.mktemp("gpu_lp"), "llama")
    return base, adapters, load_peft(base, adapters)


def _hf_lp(pm, adapter, ids) -> torch.Tensor:
    with torch.no_grad():
        if adapter is None:
            with pm.disable_adapter():
                logits = pm(input_ids=torch.tensor([ids])).logits[0]
        else:
            pm.set_adapter(adapter)
            logits = pm(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("eager", [False, True])
def test_logprobs_close_to_hf_fp32(setup, dtype, eager):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base, adapters, pm = setup
    tol = TOL[dtype]
    cfg = EngineConfig(
        model=str(base),
        device="cuda",
        dtype=dtype,
        max_loras=4,
        max_lora_rank=16,
        num_kv_blocks=256,
        enforce_eager=eager,
    )
    engine = Engine(cfg, adapters)
    g = torch.Generator().manual_seed(3)
    reqs = []
    for i, a in enumerate(PLAN):
        prompt = torch.randint(3, 256, (4 + 3 * i,), generator=g).tolist()
        sp = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=5, prompt_logprobs=2)
        reqs.append(Request(key=i, id=str(i), adapter=a, prompt_token_ids=prompt, sampling=sp))
    pairs = [("w1 w2 w3", " w4 w5"), ("w9 w8 w7 w6", " w11 w12 w13")]
    for j, (ctx, cont) in enumerate(pairs):
        reqs.append(Request(key=len(PLAN) + j, id=f"s{j}", adapter=PLAN[j], prompt=ctx, continuation=cont))
    try:
        got = engine.generate_all(reqs)
        for req, res in zip(reqs, got):
            assert res.error is None
            if req.is_scoring:
                whole, n_ctx = encode_pair(engine.tokenizer, req.prompt, req.continuation)
                lp = _hf_lp(pm, req.adapter, whole[:-1])
                want = [lp[n_ctx - 1 + j, t].item() for j, t in enumerate(whole[n_ctx:])]
                assert res.score.token_logprobs == pytest.approx(want, abs=tol)
                continue
            prompt, out = req.prompt_token_ids, res.token_ids
            lp = _hf_lp(pm, req.adapter, prompt + out)
            for i, e in enumerate(res.samples[0].logprobs):
                row = lp[len(prompt) - 1 + i]
                assert abs(e.logprob - row[out[i]].item()) < tol
                assert abs(e.top[0][2] - row.max().item()) < tol
            for j, e in enumerate(res.prompt_logprobs[1:], start=1):
                assert abs(e.logprob - lp[j - 1, prompt[j]].item()) < tol
    finally:
        engine.close()
