"""embed_tokens / lm_head adapters on CUDA (run through the device tool; skipped without a GPU): one batch mixing base,
plain-LoRA, DoRA, embedding-LoRA, lm_head-LoRA and modules_to_save rows. fp32 (decode CUDA graphs, eager, and one
slot with reloads): HF + PEFT's greedy tokens exactly, and lm_head rows' logprobs to 1e-4. bf16: HF fp32's first
token wherever HF's top-1 margin is clear of bf16 rounding, and most tokens of whole sequences agree."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.engine.test_engine_vocab import KINDS, MIXED, _build, _hf_logits, _prompts, _requests

pytestmark = pytest.mark.gpu
NEW = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, adapters = _build(tmp_path_factory.mktemp("vocab_gpu"), "llama", KINDS)
    prompts = _prompts(len(MIXED), seed=11)
    fwd = _hf_logits(base, adapters)
    tokens, margins = [], []
    for p, a in zip(prompts, MIXED):
        ids, marg = torch.tensor([p]), []
        for _ in range(NEW):
            logits = fwd(ids, a)[-1]
            top = logits.topk(2).values
            marg.append(float(top[0] - top[1]))
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        tokens.append(ids[0, len(p) :].tolist())
        margins.append(marg)
    return base, adapters, prompts, tokens, margins, fwd


def _engine(base, adapters, **kw) -> Engine:
    cfg = dict(model=str(base), device="cuda", max_lora_rank=8, max_num_seqs=16, num_kv_blocks=256)
    return Engine(EngineConfig(**{**cfg, **kw}), adapters)


@pytest.mark.parametrize("eager,max_loras", [(False, 6), (True, 6), (False, 1)])
def test_fp32_cuda_equals_hf_peft(setup, eager, max_loras):
    base, adapters, prompts, want, _, _ = setup
    engine = _engine(base, adapters, dtype="float32", enforce_eager=eager, max_loras=max_loras)
    assert (engine.runner.graphs is None) == eager  # the decode steps replay graphs holding the embedding LoRA
    got = engine.generate_all(_requests(prompts, MIXED, new=NEW))
    assert [r.error for r in got] == [None] * len(MIXED)
    assert [r.token_ids for r in got] == want
    engine.close()


def test_fp32_cuda_head_logprobs_equal_hf(setup):
    base, adapters, prompts, want, _, fwd = setup
    engine = _engine(base, adapters, dtype="float32", max_loras=6)
    got = engine.generate_all(_requests(prompts, MIXED, new=3, logprobs=1))
    for r, p, a in zip(got, prompts, MIXED):
        lsm = torch.log_softmax(fwd(torch.tensor([p + r.token_ids]), a).double(), -1)
        for i, entry in enumerate(r.samples[0].logprobs):
            assert abs(entry.logprob - float(lsm[len(p) - 1 + i, r.token_ids[i]])) < 1e-4, (a, i)
    engine.close()


def test_bf16_cuda_close_to_hf_fp32(setup):
    base, adapters, prompts, want, margins, _ = setup
    engine = _engine(base, adapters, dtype="bfloat16", max_loras=6)
    got = engine.generate_all(_requests(prompts, MIXED, new=NEW))
    assert [r.error for r in got] == [None] * len(MIXED)
    clear = [i for i, m in enumerate(margins) if m[0] > 0.05]
    assert len(clear) >= len(MIXED) // 2
    assert all(got[i].token_ids[0] == want[i][0] for i in clear)
    same = sum(a == b for r, w in zip(got, want) for a, b in zip(r.token_ids, w))
    assert same >= 0.75 * NEW * len(MIXED)
    engine.close()
