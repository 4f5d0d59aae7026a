"""embed_tokens / lm_head adapters through the whole engine on CPU (fp32): LoRA on embed_tokens (lora_embedding_A/B),
LoRA on lm_head, and modules_to_save copies of either give HF + PEFT's greedy tokens and logprobs, alone and in one
batch with base, plain-LoRA and DoRA rows; each row alone gives what it gives in the batch; a slot evicted and loaded
again gives the same tokens; a tied-embedding base adapts only the module the adapter names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_adapter, build_base, build_tokenizer, load_peft
from tests.engine.mixed_rows import assert_batch_and_rows_alone
from tests.engine.test_engine_generate import _hf_greedy

NEW = 5
KINDS = {  # name -> build_adapter kwargs
    "emb": dict(r=8, alpha=16, targets=("embed_tokens", "q_proj"), seed=41),
    "head": dict(r=4, alpha=8, targets=("lm_head", "v_proj"), seed=42),
    "mts_head": dict(r=8, alpha=16, targets=("q_proj",), modules_to_save=["lm_head"], seed=43),
    "mts_emb": dict(r=8, alpha=16, targets=("v_proj",), modules_to_save=["embed_tokens"], seed=44),
    "plain": dict(r=8, alpha=16, targets=("q_proj", "v_proj", "down_proj"), seed=45),
    "dora": dict(r=4, alpha=8, targets="all-linear", use_dora=True, seed=46),
}
MIXED = ["emb", None, "head", "plain", "dora", "mts_head", "emb", "mts_emb", "head", None]


def _build(root: Path, arch: str, kinds: dict) -> tuple[Path, dict[str, Path]]:
    base = build_base(root / "base", arch)
    build_tokenizer(base)
    return base, {n: build_adapter(base, root / n, **kw) for n, kw in kinds.items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    return _build(tmp_path_factory.mktemp("vocab"), "llama", KINDS)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 256, (int(torch.randint(3, 15, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _requests(prompts, plan, new: int = NEW, **sampling) -> list[Request]:
    sp = SamplingParams(max_tokens=new, ignore_eos=True, **sampling)
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=sp)
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def _hf_logits(base: Path, adapters: dict[str, Path]):
    """ids [1, n], adapter name (None: base) -> HF + PEFT fp32 logits [n, V]. One PeftModel per adapter: PEFT
    cannot hold an lm_head LoRA and an lm_head modules_to_save copy in one model."""
    models = {}

    def logits(ids: torch.Tensor, a: str | None) -> torch.Tensor:
        key = a if a is not None else next(iter(adapters))
        if key not in models:
            models[key] = load_peft(base, {key: adapters[key]})
        pm = models[key]
        with torch.no_grad():
            if a is None:
                with pm.disable_adapter():
                    return pm(input_ids=ids).logits[0]
            return pm(input_ids=ids).logits[0]

    return logits


def _hf_greedy_each(base, adapters, prompts, plan, new: int = NEW) -> list[list[int]]:
    fwd, out = _hf_logits(base, adapters), []
    for p, a in zip(prompts, plan):
        ids = torch.tensor([p])
        for _ in range(new):
            ids = torch.cat([ids, fwd(ids, a)[-1].argmax(-1).view(1, 1)], dim=1)
        out.append(ids[0, len(p) :].tolist())
    return out


def _engine(base, adapters, **kw) -> Engine:
    return Engine(EngineConfig(model=str(base), device="cpu", max_lora_rank=8, **kw), adapters)


@pytest.mark.parametrize("kind", ["emb", "head", "mts_head", "mts_emb"])
def test_each_kind_alone_matches_hf_peft(tiny, kind):
    base, adapters = tiny
    prompts = _prompts(3, seed=1)
    plan = [kind] * 3
    got = _engine(base, {kind: adapters[kind]}, max_loras=1).generate_all(_requests(prompts, plan))
    assert [r.error for r in got] == [None] * 3
    assert [r.token_ids for r in got] == _hf_greedy(base, {kind: adapters[kind]}, prompts, plan, new=NEW)
    bare = _engine(base, {}).generate_all(_requests(prompts, [None] * 3))
    assert [r.token_ids for r in got] != [r.token_ids for r in bare]  # the adapter's vocab module changes them


def test_mixed_batch_matches_hf_peft_and_rows_alone(tiny):
    base, adapters = tiny
    prompts = _prompts(len(MIXED))
    want = _hf_greedy_each(base, adapters, prompts, MIXED)
    assert_batch_and_rows_alone(_engine(base, adapters, max_loras=6), lambda: _requests(prompts, MIXED), want)


def test_logprobs_of_head_rows_equal_hf_log_softmax(tiny):
    """Sampled-token and prompt logprobs of lm_head-LoRA and modules_to_save-head rows (in a batch with base rows)
    are HF + PEFT's log_softmax to 1e-4."""
    base, adapters = tiny
    plan = ["head", None, "mts_head", "emb"]
    prompts = _prompts(len(plan), seed=3)
    engine = _engine(base, adapters, max_loras=4)
    got = engine.generate_all(_requests(prompts, plan, new=3, logprobs=2, prompt_logprobs=1))
    fwd = _hf_logits(base, adapters)
    for r, p, a in zip(got, prompts, plan):
        assert r.error is None
        logits = fwd(torch.tensor([p + r.token_ids]), a)
        lsm = torch.log_softmax(logits.double(), -1)
        for i, entry in enumerate(r.samples[0].logprobs):  # token i generated at position len(p) + i
            assert abs(entry.logprob - float(lsm[len(p) - 1 + i, r.token_ids[i]])) < 1e-4, (a, i)
            top = lsm[len(p) - 1 + i].topk(2)
            assert [t[0] for t in entry.top] == top.indices.tolist(), (a, i)
        for j, entry in enumerate(r.prompt_logprobs[1:], start=1):
            assert abs(entry.logprob - float(lsm[j - 1, p[j]])) < 1e-4, (a, j)


def test_eviction_and_reload_give_the_same_tokens(tiny):
    """max_loras=1, the batch twice: every adapter (and its full-weight copy) leaves its slot and comes back."""
    base, adapters = tiny
    plan = ["mts_head", "emb", "head", None, "mts_emb", "mts_head", "emb", "head"]
    prompts = _prompts(len(plan), seed=6)
    roomy = _engine(base, adapters, max_loras=6).generate_all(_requests(prompts, plan))
    tight = _engine(base, adapters, max_loras=1)
    for _ in range(2):
        got = tight.generate_all(_requests(prompts, plan))
        assert [r.token_ids for r in got] == [r.token_ids for r in roomy]
    assert tight.slots.evictions >= 4
    # PEFT's saved base embed / head of the LoRA adapters: compared with the base's once each, not at every reload
    assert sorted(n for n, _ in tight._base_checked) == ["emb", "head"]
    assert tight.runner.vocab.head_full.shape[0] == 1  # one copy slot for one GPU slot (two adapters have one)


@pytest.mark.parametrize(
    "arch,kind",
    [("llama-tied", "emb"), ("llama-tied", "head"), ("llama-tied", "mts_head"), ("gemma2", "emb"), ("gemma2", "head")],
)
def test_tied_embedding_base(tmp_path, arch, kind):
    """lm_head tied to embed_tokens: an lm_head adapter changes only the head, an embedding one only the input.
    Gemma 2 (tied too): the embedding delta is scaled by sqrt(H) with the embedding, the head's LoRA is added
    before the final soft-capping."""
    base, adapters = _build(tmp_path, arch, {kind: KINDS[kind]})
    plan = [kind, None, kind]
    prompts = _prompts(len(plan), seed=8)
    got = _engine(base, adapters, max_loras=2).generate_all(_requests(prompts, plan))
    assert [r.token_ids for r in got] == _hf_greedy(base, adapters, prompts, plan, new=NEW)


def test_changed_base_layer_copy_is_refused(tiny, tmp_path):
    """PEFT saves embed_tokens' base layer with an embedding LoRA and loads it over the base's: a copy that differs
    (a trained or changed vocabulary) gets an error record, not a silently different embedding."""
    import shutil

    from safetensors.torch import load_file, save_file

    base, adapters = tiny
    bad = tmp_path / "emb_changed"
    shutil.copytree(adapters["emb"], bad)
    t = load_file(bad / "adapter_model.safetensors")
    key = next(k for k in t if k.endswith("embed_tokens.base_layer.weight"))
    t[key] = t[key] + 0.01
    save_file(t, bad / "adapter_model.safetensors")
    got = _engine(base, {"bad": bad, "emb": adapters["emb"]}, max_loras=2).generate_all(
        _requests(_prompts(2), ["bad", "emb"])
    )
    assert got[0].error is not None and "base layer that differs" in got[0].error.message
    assert got[1].error is None


def test_triton_kernels_match_hf_peft(tiny, monkeypatch):
    """MULTILORA_KERNELS=triton: the CUDA path's SGMV kernels (the embedding LoRA as an expand of A_embᵀ[id], the
    lm_head LoRA on the logits) under the interpreter give HF + PEFT's tokens too."""
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setenv("MULTILORA_KERNELS", "triton")
    base, adapters = tiny
    plan = ["emb", "head", None, "plain", "emb", "head"]
    prompts = _prompts(len(plan), seed=9)
    got = _engine(base, adapters, max_loras=3).generate_all(_requests(prompts, plan, new=3))
    assert [r.token_ids for r in got] == _hf_greedy_each(base, adapters, prompts, plan, new=3)


def test_scoring_sees_the_adapted_head_and_embedding(tiny):
    """Scoring lines (continuation logprobs) of lm_head / copy / embedding adapters and the base, in one batch,
    equal HF + PEFT's log_softmax."""
    from multilora_cli.engine.scoring import encode_pair

    base, adapters = tiny
    plan = ["head", "mts_head", "emb", None]
    pairs = [("w1 w2 w3", " w4 w5"), ("w9 w8 w7", " w11 w2"), ("w3 ", "w3 w3 w3"), ("w5", " w6")]
    engine = _engine(base, adapters, max_loras=4)
    reqs = [
        Request(key=i, id=str(i), adapter=a, prompt=ctx, continuation=cont)
        for i, (a, (ctx, cont)) in enumerate(zip(plan, pairs))
    ]
    fwd = _hf_logits(base, adapters)
    for req, res in zip(reqs, engine.generate_all(reqs)):
        assert res.error is None
        whole, n_ctx = encode_pair(engine.tokenizer, req.prompt, req.continuation)
        lsm = torch.log_softmax(fwd(torch.tensor([whole[:-1]]), req.adapter).double(), -1)
        want = [float(lsm[n_ctx - 1 + j, t]) for j, t in enumerate(whole[n_ctx:])]
        assert len(res.score.token_logprobs) == len(want)
        assert all(abs(a - b) < 1e-4 for a, b in zip(res.score.token_logprobs, want)), req.adapter
