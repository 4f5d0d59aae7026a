"""Engine end to end on CPU: mixed-adapter batches equal HF transformers + PEFT, and batching never changes output.

Reference: a plain greedy loop over HF `model(ids).logits[:, -1].argmax()` with the PEFT adapter set (or
disabled for base rows), so eos handling cannot hide a difference; our requests use ignore_eos to match.
Every engine here is pinned to the CPU (fp32 exactness is a CPU contract; on a GPU machine `auto` would run
bf16 on CUDA): the GPU counterparts are tests/engine/test_engine_gpu.py (`-m gpu`).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed, load_peft

PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None, "mlp16", "all4rs"]  # one mixed batch, base rows included
NEW = 6


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 256, (int(torch.randint(3, 19, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _requests(prompts, plan, **sampling) -> list[Request]:
    sp = dict(max_tokens=NEW, ignore_eos=True, **sampling)
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(**sp))
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def _hf_greedy(base: Path, adapters: dict[str, Path], prompts, plan, new: int = NEW) -> list[list[int]]:
    """HF + PEFT fp32 greedy continuations of `new` tokens, each prompt under its adapter of `plan` (None: base)."""
    pm = load_peft(base, adapters)
    out = []
    with torch.no_grad():
        for p, a in zip(prompts, plan):
            ids = torch.tensor([p])
            for _ in range(new):
                if a is None:
                    with pm.disable_adapter():
                        logits = pm(input_ids=ids).logits
                else:
                    pm.set_adapter(a)
                    logits = pm(input_ids=ids).logits
                ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            out.append(ids[0, len(p) :].tolist())
    return out


@pytest.mark.parametrize("arch", ["llama", "llama-tied", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "phi3-longrope"])
def test_mixed_batch_matches_hf_peft(tmp_path, arch):
    """Gemma and Phi-3: prompts of 3-18 tokens run past their 5- and 7-token windows; phi3-longrope's prompts are
    below and above its LongRoPE switch at 12, and several decode across it (the KV recompute at the switch, in
    each row's own adapter); their adapters are PEFT's on the fused qkv_proj / gate_up_proj, one with
    layers_to_transform."""
    base, adapters = build_mixed(tmp_path, arch)
    prompts = _prompts(len(PLAN))
    engine = Engine(EngineConfig(model=str(base), device="cpu", max_loras=4, max_lora_rank=16), adapters)
    got = engine.generate_all(_requests(prompts, PLAN))
    want = _hf_greedy(base, adapters, prompts, PLAN)
    assert [r.error for r in got] == [None] * len(PLAN)
    assert [r.token_ids for r in got] == want
    assert all(r.finish_reason == "length" and r.completion_tokens == NEW for r in got)
    # the adapters matter: some adapted row differs from the same prompt on the base model
    base_only = engine.generate_all(_requests(prompts, [None] * len(PLAN)))
    assert any(b.token_ids != g.token_ids for b, g, a in zip(base_only, got, PLAN) if a)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("llama"), "llama")


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 7}, {"temperature": 1.3}])
def test_batch_invariance(llama, sampling):
    """Each request alone == the same request inside a mixed batch (greedy and seeded sampling)."""
    base, adapters = llama
    prompts = _prompts(len(PLAN), seed=3)
    engine = Engine(EngineConfig(model=str(base), device="cpu", max_loras=3, max_lora_rank=16, seed=5), adapters)
    reqs = _requests(prompts, PLAN, **sampling)
    batched = engine.generate_all(reqs)
    alone = [engine.generate_all([r])[0] for r in _requests(prompts, PLAN, **sampling)]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    if sampling.get("temperature"):  # sampling really sampled: not the greedy text everywhere
        greedy = engine.generate_all(_requests(prompts, PLAN))
        assert [r.token_ids for r in greedy] != [r.token_ids for r in batched]


def _many_adapters(root: Path, src: Path, n: int) -> dict[str, Path]:
    """n real PEFT adapters: copies of one PEFT checkpoint with freshly randomised lora_B."""
    from safetensors.torch import load_file, save_file

    out = {}
    for i in range(n):
        d = root / f"ad{i}"
        shutil.copytree(src, d)
        t = load_file(d / "adapter_model.safetensors")
        g = torch.Generator().manual_seed(100 + i)
        t = {k: (torch.randn(v.shape, generator=g) * 0.1 if "lora_B" in k else v) for k, v in t.items()}
        save_file(t, d / "adapter_model.safetensors", metadata={"format": "pt"})
        out[f"ad{i}"] = d
    return out


def test_slot_pressure_and_preemption(llama, tmp_path):
    """10 adapters through 2 slots, and a KV cache too small for everything at once: same tokens as roomy runs."""
    base, adapters = llama
    many = _many_adapters(tmp_path, adapters["all4rs"], 10)
    plan = [f"ad{i % 10}" for i in range(20)] + [None] * 4
    prompts = _prompts(len(plan), seed=9)
    roomy = Engine(EngineConfig(model=str(base), device="cpu", max_loras=10, max_lora_rank=8), many)
    want = roomy.generate_all(_requests(prompts, plan))
    tight = Engine(
        EngineConfig(model=str(base), device="cpu", max_loras=2, max_lora_rank=8, block_size=4, num_kv_blocks=14), many
    )
    got = tight.generate_all(_requests(prompts, plan))
    assert [r.error for r in got] == [None] * len(plan)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    # the counts are asserted where reads run on the step loop's thread: with background reads, which rows run
    # together (so how often the cache overflows) depends on read timing; the tokens never do
    inline = Engine(replace(tight.config, prefetch_threads=0), many)
    assert tight.slots.prefetching and not inline.slots.prefetching
    assert [r.token_ids for r in inline.generate_all(_requests(prompts, plan))] == [r.token_ids for r in want]
    st = inline.stats
    assert st.slot_loads >= 10 and st.slot_evictions >= 8 and st.slot_loads == st.slot_evictions + 2
    assert st.preemptions > 0
    assert roomy.stats.slot_evictions == 0 and roomy.stats.preemptions == 0
    assert sum(a.slot_loads for a in st.per_adapter.values()) == st.slot_loads


@pytest.mark.parametrize(
    "field,value", [("prefetch_threads", -1), ("prefetch_threads", True), ("prefetch_threads", 1.5), ("run_ahead", 1)]
)
def test_engine_knobs_are_validated(field, value):
    from multilora_cli.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        EngineConfig(model="m", **{field: value})


def test_errors_are_per_request(llama):
    """Unknown adapters, empty and too-long prompts fail alone; everything else still runs."""
    base, adapters = llama
    engine = Engine(
        EngineConfig(model=str(base), device="cpu", max_loras=2, max_lora_rank=16, max_model_len=32), adapters
    )
    reqs = _requests(_prompts(4, seed=1), ["qv8", "nope", None, "base"])
    reqs.append(Request(key=4, id="long", prompt_token_ids=list(range(3, 40)), sampling=SamplingParams(max_tokens=2)))
    reqs.append(Request(key=5, id="empty", prompt_token_ids=[], sampling=SamplingParams(max_tokens=2)))
    reqs.append(Request(key=6, id="text", prompt="w5 w6 w7", sampling=SamplingParams(max_tokens=3)))
    got = engine.generate_all(reqs)
    codes = [r.error.code if r.error else None for r in got]
    assert codes[1] == "unknown_adapter" and codes[4] == "prompt_too_long" and codes[5] == "empty_prompt"
    assert codes[0] is None and codes[2] is None and codes[3] is None and codes[6] is None
    assert got[3].adapter is None  # "base" means the base model
    assert got[6].prompt_tokens == 4 and got[6].text  # <s> + 3 words; decoded text comes back
    assert engine.stats.errors == 3 and engine.stats.requests == 7


def test_stop_strings_and_eos(llama):
    base, adapters = llama
    engine = Engine(EngineConfig(model=str(base), device="cpu", max_loras=2, max_lora_rank=16), adapters)
    p = _prompts(1, seed=4)[0]
    free = engine.generate_all(
        [Request(key=0, id="a", prompt_token_ids=p, sampling=SamplingParams(max_tokens=8, ignore_eos=True))]
    )[0]
    words = free.text.split()
    assert len(words) == 8
    stop = words[3]
    cut = engine.generate_all(
        [
            Request(
                key=0, id="a", prompt_token_ids=p, sampling=SamplingParams(max_tokens=8, stop=[stop], ignore_eos=True)
            )
        ]
    )[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.index(stop)]


def test_run_ahead_changes_no_output(llama, monkeypatch):
    """The engine launching each next decode step before reading this one's ids (EngineConfig.run_ahead; on CPU the
    same control flow, run synchronously): the same results as one step at a time, with sequences stopping
    mid-decode on stop strings (their extra fed token dropped) and by length in one run, greedy and seeded
    sampled requests mixed (an ahead step samples at the position after the one still in flight); a caller that
    stops reading while a step is in flight leaves the engine usable."""
    base, adapters = llama
    prompts = _prompts(12, seed=6)
    plan = (PLAN + PLAN)[:12]
    # reads on the step loop's thread: whether a step is launched ahead (and a result handed out while one is in
    # flight) depends on which rows run together, which with background reads depends on read timing
    cfg = EngineConfig(model=str(base), device="cpu", max_loras=4, max_lora_rank=16, max_num_seqs=6, prefetch_threads=0)
    free = Engine(replace(cfg, run_ahead=False), adapters).generate_all(
        [  # each prompt's greedy text, to pick stop strings from
            Request(
                key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(max_tokens=14, ignore_eos=True)
            )
            for i, (p, a) in enumerate(zip(prompts, plan))
        ]
    )

    def requests():
        out = []
        for i, (p, a) in enumerate(zip(prompts, plan)):
            sp = dict(max_tokens=10 + 4 * (i % 2), ignore_eos=True)
            words = free[i].text.split()
            if i % 2 == 0 and len(words) > 5:
                sp["stop"] = [words[3 + i % 3]]  # a word of its own greedy text: it stops mid-decode
            elif i % 4 == 1:
                sp.update(temperature=0.9, seed=i)  # plain sampling
            elif i % 4 == 3:
                sp.update(temperature=1.1, top_p=0.9, top_k=50, seed=i)  # sorted, filtered sampling
            out.append(Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(**sp)))
        return out

    runs = {}
    for ahead in (False, True):
        engine = Engine(replace(cfg, run_ahead=ahead), adapters)
        got = engine.generate_all(requests())
        runs[ahead] = [(r.token_ids, r.text, r.finish_reason, r.error) for r in got]
        assert (engine.scheduler.num_ahead_steps > 0) == ahead
    assert runs[True] == runs[False]
    sampled = [t for i, (t, *_rest) in enumerate(runs[True]) if i % 2]
    assert sampled != [free[i].token_ids[: len(t)] for i, t in zip(range(1, 12, 2), sampled)]  # really sampled
    assert sum(r == "stop" and len(t) > 2 for t, _, r, _ in runs[True]) >= 3  # stops well into the decode

    engine = Engine(cfg, adapters)  # run_ahead on (the default)
    gen = engine.generate(requests())
    for res in gen:  # read until a result arrives while the next step is in flight (one that stopped early)
        assert res.error is None
        if engine.scheduler._pending:
            break
    assert engine.scheduler._pending, "no result was handed out while a step was in flight"
    gen.close()
    assert not engine.scheduler._pending
    new = [
        Request(key=100 + i, id=f"new{i}", adapter=a, prompt_token_ids=p, sampling=SamplingParams(max_tokens=3))
        for i, (p, a) in enumerate(zip(prompts[:2], plan[:2]))
    ]
    again = engine.generate_all(new)  # (the unread requests of the closed call finish here too, as before)
    assert all(r.error is None for r in again) and {"new0", "new1"} <= {r.id for r in again}

    # Ctrl-C while waiting for a step's ids with the next step in flight: the interrupt reaches the caller as it
    # is (the engine does not postprocess the step in flight ahead of the one before it)
    from multilora_cli.engine import runner as runner_mod

    real, hit = runner_mod.ModelRunner.collect, []

    def interrupted(self, launched):
        if not hit and engine.scheduler.num_ahead_steps >= 2 and len(engine.scheduler._pending) == 2:
            hit.append(launched)  # once
            raise KeyboardInterrupt
        return real(self, launched)

    engine = Engine(cfg, adapters)
    monkeypatch.setattr(runner_mod.ModelRunner, "collect", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.generate_all(requests())
    assert hit


def test_max_model_len_above_the_trained_positions_is_refused(llama):
    from multilora_cli.errors import ConfigError
    from multilora_cli.models.config import ModelConfig

    base, adapters = llama
    limit = ModelConfig.from_dir(base).max_position_embeddings
    Engine(
        EngineConfig(model=str(base), device="cpu", max_model_len=limit), adapters
    ).close()  # the limit itself is fine
    with pytest.raises(
        ConfigError,
        match=rf"--max-model-len {limit + 1} is above the model's "
        rf"max_position_embeddings \({limit}",
    ) as e:
        Engine(EngineConfig(model=str(base), device="cpu", max_model_len=limit + 1), adapters)
    assert e.value.exit_code == 2


def test_the_generate_loop_runs_with_the_engines_heap_frozen_and_leaves_it_unfrozen(llama):
    """engine/gc_heap.py around the step loop: frozen while results come, unfrozen once the loop ends or is closed
    early (a consumer that stops reading), so the heap's garbage is collected again after it."""
    import gc

    base, adapters = llama
    prompts = _prompts(len(PLAN), seed=4)
    engine = Engine(EngineConfig(model=str(base), device="cpu", max_loras=3, max_lora_rank=16), adapters)
    assert gc.get_freeze_count() == 0
    frozen = [gc.get_freeze_count() for _ in engine.generate(_requests(prompts, PLAN))]
    assert len(frozen) == len(PLAN) and min(frozen) > 0
    assert gc.get_freeze_count() == 0
    it = engine.generate(_requests(prompts, PLAN))
    next(it)
    assert gc.get_freeze_count() > 0
    it.close()  # stopped early
    assert gc.get_freeze_count() == 0
