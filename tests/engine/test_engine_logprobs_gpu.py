"""Logprobs, prompt logprobs and scoring on CUDA (skipped without a GPU): a mixed-adapter batch with decode CUDA
graphs (the logprobs are computed outside the graph from the logits it returns) and with run-ahead steps, against
HF + PEFT in fp32 on the CPU: bf16 within 2e-2, fp32 within 1e-4, for every completion logprob (of the engine's
own tokens), the top-1 logprob, every prompt logprob and each scoring line's logprob. bf16: within 2e-2, or within
1.5x of the error HF's own bf16 model makes against its fp32 on the same sequences where that is larger (the
tiny model's bf16 weights alone put some logprobs 0.027 off fp32; a bound below that no bf16 engine can meet)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.scoring import encode_pair
from tests.builders import build_mixed, load_peft
from tests.engine.test_engine_logprobs import _hf_logprobs as _hf_lp

pytestmark = pytest.mark.gpu

PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None, "mlp16", "all4rs"]
TOL = {"bfloat16": 2e-2, "float32": 1e-4}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, adapters = build_mixed(tmp_path_factory.mktemp("gpu_lp"), "llama")
    return base, adapters, load_peft(base, adapters)


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
    ours, ref, hf16 = [], [], []  # every checked logprob: ours, HF fp32's, HF bf16's

    def check(got_lp: float, ids, adapter, pos: int, tok: int | None) -> None:
        """ours vs HF at position `pos` of `ids`: the logprob of `tok` (None: the top-1 logprob)."""
        for model, out in ((pm, ref), (pm16, hf16)):
            if model is not None:
                row = _hf_lp(model, adapter, ids)[pos]
                out.append(row.max().item() if tok is None else row[tok].item())
        ours.append(got_lp)

    pm16 = None
    if dtype == "bfloat16":
        import copy

        pm16 = copy.deepcopy(pm).to(torch.bfloat16)
    try:
        got = engine.generate_all(reqs)
        for req, res in zip(reqs, got):
            assert res.error is None
            if req.is_scoring:
                whole, n_ctx = encode_pair(engine.tokenizer, req.prompt, req.continuation)
                for j, t in enumerate(whole[n_ctx:]):
                    check(res.score.token_logprobs[j], whole[:-1], req.adapter, n_ctx - 1 + j, t)
                continue
            prompt, out = req.prompt_token_ids, res.token_ids
            for i, e in enumerate(res.samples[0].logprobs):
                check(e.logprob, prompt + out, req.adapter, len(prompt) - 1 + i, out[i])
                check(e.top[0][2], prompt + out, req.adapter, len(prompt) - 1 + i, None)
            for j, e in enumerate(res.prompt_logprobs[1:], start=1):
                check(e.logprob, prompt + out, req.adapter, j - 1, prompt[j])
        ours_t, ref_t = torch.tensor(ours), torch.tensor(ref)
        if pm16 is not None:  # the bf16 weights' own error, as HF's bf16 model makes it on the same sequences
            tol = max(tol, 1.5 * (torch.tensor(hf16) - ref_t).abs().max().item())
        assert (ours_t - ref_t).abs().max().item() < tol
    finally:
        engine.close()
