"""DoRA through the whole engine on CPU (fp32): one mixed batch of base, plain-LoRA and DoRA rows gives HF + PEFT's
greedy tokens; each row alone gives what it gives in the batch; a DoRA adapter evicted from its slot and loaded
again gets the same norms (and tokens) as in a roomy run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_adapter, build_base, build_tokenizer
from tests.engine.mixed_rows import assert_batch_and_rows_alone
from tests.engine.test_engine_generate import _hf_greedy

NEW = 5
KINDS = {  # name -> build_adapter kwargs
    "plain": dict(r=8, alpha=16, targets=("q_proj", "v_proj", "down_proj"), seed=31),
    "dora": dict(r=4, alpha=8, targets="all-linear", use_dora=True, seed=32),
    "dora_qv": dict(r=8, alpha=16, targets=("q_proj", "v_proj", "gate_proj"), use_dora=True, seed=33),
}
PLAN = ["dora", None, "plain", "dora_qv", "dora", "plain", None, "dora_qv"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("dora")
    base = build_base(root / "base", "llama")
    build_tokenizer(base)
    return base, {n: build_adapter(base, root / n, **kw) for n, kw in KINDS.items()}


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 256, (int(torch.randint(3, 15, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _requests(prompts, plan, new: int = NEW) -> list[Request]:
    sp = SamplingParams(max_tokens=new, ignore_eos=True)
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=sp)
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def _engine(base, adapters, **kw) -> Engine:
    return Engine(EngineConfig(model=str(base), device="cpu", max_lora_rank=8, **kw), adapters)


def _check_reloads(engine: Engine) -> dict[str, torch.Tensor]:
    """Wraps the engine's slot installs: each adapter's DoRA scale rows (every LoRA module's, concatenated) are
    kept from its first load, and every later load of it must give the same rows. Returns those rows by name."""
    mods = engine.runner.adapters.lora_modules
    rows: dict[str, torch.Tensor] = {}

    def install(slot, name, obj, inner=engine.runner.install_adapter):
        inner(slot, name, obj)
        got = torch.cat([m.lora.dora[slot] for m in mods.values()])
        if name in rows:
            assert torch.equal(got, rows[name]), name
        rows[name] = got.clone()

    engine.slots._install = install
    return rows


def test_mixed_batch_matches_hf_peft_and_rows_alone(tiny):
    base, adapters = tiny
    prompts = _prompts(len(PLAN))
    want = _hf_greedy(base, adapters, prompts, PLAN, new=NEW)
    assert_batch_and_rows_alone(_engine(base, adapters, max_loras=3), lambda: _requests(prompts, PLAN), want)


def test_dora_changes_the_tokens(tiny, tmp_path):
    """The same adapter without its magnitudes (a plain LoRA) generates differently: DoRA's scale is applied."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    base, adapters = tiny
    plain = tmp_path / "dora_as_lora"
    shutil.copytree(adapters["dora"], plain)
    cfg = json.loads((plain / "adapter_config.json").read_text())
    (plain / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": False}))
    t = load_file(plain / "adapter_model.safetensors")
    save_file({k: v for k, v in t.items() if "magnitude" not in k}, plain / "adapter_model.safetensors")
    prompts = _prompts(6, seed=4)
    engine = _engine(base, {"dora": adapters["dora"], "lora": plain}, max_loras=2)
    a = engine.generate_all(_requests(prompts, ["dora"] * 6))
    b = engine.generate_all(_requests(prompts, ["lora"] * 6))
    assert [r.token_ids for r in a] != [r.token_ids for r in b]


def test_dora_eviction_and_reload_recompute_the_same_norms(tiny):
    """max_loras=1, the batch run twice: every adapter is evicted and loaded again (the scheduler groups rows by
    adapter, so within one run each loads once); the slot's scale rows after a reload equal those of its first
    load, and the tokens equal the roomy run's."""
    base, adapters = tiny
    plan = ["dora", "plain", "dora_qv", None, "dora", "plain", "dora_qv", "dora"]
    prompts = _prompts(len(plan), seed=6)
    roomy = _engine(base, adapters, max_loras=3).generate_all(_requests(prompts, plan))
    tight = _engine(base, adapters, max_loras=1)
    rows = _check_reloads(tight)
    for _ in range(2):
        got = tight.generate_all(_requests(prompts, plan))
        assert [r.token_ids for r in got] == [r.token_ids for r in roomy]
    loads = tight.slots.adapter_loads
    assert loads["dora"] + loads["dora_qv"] >= 3  # a DoRA adapter was loaded again (its rows checked above)
    assert torch.equal(rows["plain"], torch.ones_like(rows["plain"]))  # plain LoRA slot: all ones
    assert (rows["dora"] != 1).all()  # all-linear DoRA: every output feature rescaled


def test_slot_loads_made_ahead_of_admission_change_nothing(tiny):
    """Scheduler.preload (on by default on CUDA, where the loads overlap the step in flight; set here on CPU):
    adapters already read are installed between a step's launch and its read-back, into free slots or over
    adapters with no queued work. The tokens are HF + PEFT's, and a DoRA adapter evicted and loaded again (ahead
    or not) has the rows of its first load."""
    base, adapters = tiny
    plan = ["dora", "plain", "dora_qv", None, "dora", "plain", "dora_qv", "dora"] * 2
    prompts = _prompts(len(plan), seed=8)
    want = _hf_greedy(base, adapters, prompts, plan, new=NEW)
    # one seat, two slots: the idle slot takes the next adapter ahead; reads on this thread (no prefetch threads),
    # so which adapters are in the host cache, and hence the preloads, are the same every run
    engine = _engine(base, adapters, max_loras=2, max_num_seqs=1, prefetch_threads=0)
    engine.preloads_per_step = 2
    _check_reloads(engine)
    for _ in range(2):
        got = engine.generate_all(_requests(prompts, plan))
        assert [r.token_ids for r in got] == want
    assert engine.slots.preloads >= 2
    assert sum(engine.slots.adapter_loads.values()) > len(KINDS)  # evictions and reloads happened
