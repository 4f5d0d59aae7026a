"""Slot preloads on CUDA (issue 38; run through the device tool, skipped without a GPU): adapters are loaded into
free slots, or over adapters with no queued work, while steps run (`Scheduler.preload`), and the tokens are
HF + PEFT's, as with preloads off.

Two workloads: a slot for every adapter (no eviction), and slot pressure (many adapters, few slots, requests of
different lengths: every preload that is not into a free slot evicts an adapter whose last sequence may still
ride a step launched ahead, so a load that did not wait for that step would change tokens). Preloads are made
certain to fire by reading every adapter into the host cache first (`SlotManager.warm`): `preload` only takes
adapters whose host copy is at hand, and whether a background read finished in time is the test machine's luck.
A cold run (the reads in the background, lazy graph captures beside them) checks the tokens only.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed
from tests.engine.test_engine_generate import _hf_greedy, _many_adapters, _prompts, _requests

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(cfg: EngineConfig, adapters: dict, requests, preloads: int, warm: bool):
    """(token ids per request, slot stats, ahead steps) of one engine run with `preloads` per step; `warm`: every
    adapter read into the host cache before the run (the engine preloads on CUDA only: set here, so CPU runs
    exercise the same bookkeeping)."""
    engine = Engine(cfg, adapters)
    engine.preloads_per_step = preloads
    try:
        if warm:
            for name in adapters:
                engine.slots.warm(name)
            # each read once; the host cache keeps the last ones the arena holds beside a wave of reads (CUDA: 40
            # of 48, 59 of 64), so the first admissions read theirs again and the later adapters are all at hand
            assert engine.slots.stats()["cpu_loads"] == len(adapters)
        res = engine.generate_all(requests)
        assert [r.error for r in res] == [None] * len(requests)
        return [r.token_ids for r in res], engine.slots.stats(), engine.scheduler.num_ahead_steps
    finally:
        engine.close()


def check_preloads(tmp_path, device: str, n: int) -> None:
    """n adapters of 2 requests each (and 4 base ones) in n slots: HF + PEFT's tokens with preloads on (host-warm:
    some must fire; cold: whatever the reads allow) and off, every adapter loaded once, nothing evicted."""
    base, adapters = build_mixed(tmp_path / "m", "llama")
    many = _many_adapters(tmp_path, adapters["all4rs"], n)
    plan = [f"ad{i % n}" for i in range(2 * n)] + [None] * 4
    prompts = _prompts(len(plan), seed=5)
    want = _hf_greedy(base, many, prompts, plan)
    cfg = EngineConfig(
        model=str(base), device=device, dtype="float32", max_loras=n, max_lora_rank=8, max_num_seqs=8, num_kv_blocks=512
    )
    for preloads, warm in ((2, True), (2, False), (0, True)):
        got, st, _ = _run(cfg, many, _requests(prompts, plan), preloads, warm)
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, f"preloads {preloads}, warm {warm}: rows {bad} differ from HF + PEFT (a load raced a step?)"
        assert st["evictions"] == 0 and st["loads"] == n, f"preloads {preloads}, warm {warm}: slot stats {st}"
        if not preloads:
            assert st["preloads"] == 0, f"preloads fired while off: slot stats {st}"
        elif warm:  # every adapter read and a slot free for each: the first step's preloads cannot find nothing
            assert st["preloads"] > 0, f"no preload fired with every adapter read: slot stats {st}"


def check_preload_stress(tmp_path, device: str, n: int, slots: int, per_adapter: int = 3) -> None:
    """n adapters of `per_adapter` requests of 2-13 new tokens each (and a few base ones) through `slots` slots,
    8 seats (slots must exceed the adapters that fill them, or no slot is ever free for a preload), run-ahead on: host-warm runs with preloads on and off give the same tokens, HF + PEFT's, with
    evictions and (on) preloads; a cold run with preloads on gives them too."""
    base, adapters = build_mixed(tmp_path / "m", "llama")
    many = _many_adapters(tmp_path, adapters["all4rs"], n)
    plan = [f"ad{i % n}" for i in range(per_adapter * n)] + [None] * 3
    lengths = [2 + (i * 5) % 12 for i in range(len(plan))]  # sequences finish at different steps
    prompts = _prompts(len(plan), seed=11)
    ref = _hf_greedy(base, many, prompts, plan, new=max(lengths))
    want = [w[:k] for w, k in zip(ref, lengths)]  # greedy: a shorter request is a prefix of the longer one
    cfg = EngineConfig(
        model=str(base),
        device=device,
        dtype="float32",
        max_loras=slots,
        max_lora_rank=8,
        max_num_seqs=8,
        num_kv_blocks=512,
        run_ahead=True,
    )

    def requests():
        return [
            Request(
                key=i,
                id=str(i),
                adapter=a,
                prompt_token_ids=p,
                sampling=SamplingParams(max_tokens=k, ignore_eos=True),
            )
            for i, (p, a, k) in enumerate(zip(prompts, plan, lengths))
        ]

    got = {}
    for preloads, warm in ((2, True), (0, True), (2, False)):
        toks, st, ahead = _run(cfg, many, requests(), preloads, warm)
        got[preloads, warm] = toks
        bad = [i for i, (g, w) in enumerate(zip(toks, want)) if g != w]
        assert not bad, f"preloads {preloads}, warm {warm}: rows {bad} differ from HF + PEFT (a load raced a step?)"
        assert st["evictions"] > 0, f"no slot pressure: slot stats {st}"
        assert ahead > 0, "no step was launched ahead: the eviction-under-a-running-step case was not exercised"
        if not preloads:
            assert st["preloads"] == 0, f"preloads fired while off: slot stats {st}"
        elif warm:
            assert st["preloads"] > 0, f"no preload fired with every adapter read: slot stats {st}"
    assert got[2, True] == got[0, True] == got[2, False]


def test_preloads_fire_with_a_slot_for_every_adapter_and_change_no_token(tmp_path):
    check_preloads(tmp_path, "cuda", 48)


def test_preloads_under_slot_pressure_with_run_ahead_change_no_token(tmp_path):
    """64 adapters through 10 slots (about 3 adapters fill the 8 seats; the spare slots take preloads): 195
    requests, 54+ evictions, some of them by preloads beside steps in flight. With 5 slots no preload fired on an
    H200: each freed seat's admission took the one spare slot before a preload could."""
    check_preload_stress(tmp_path, "cuda", 64, 10)
