"""engine/gc_heap.py: while an engine generates, the objects from before the run are frozen for the collector,
and the heap is as it was after the run (also after an abandoned one); a freeze made by someone else, a disabled
collector and a nested run are left alone; closing the engine thaws a freeze its unfinished run left."""

from __future__ import annotations

import gc

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.gc_heap import FrozenHeap
from multilora_cli.engine.request import Request
from tests.builders import build_base, build_tokenizer


def test_frozen_for_the_block_and_nested_blocks_leave_it():
    assert gc.get_freeze_count() == 0
    heap, other = FrozenHeap(), FrozenHeap()
    with heap.during() as froze:
        assert froze and gc.get_freeze_count() > 0
        with other.during() as inner:
            assert not inner
        other.thaw()
        assert gc.get_freeze_count() > 0  # the inner block did not undo the outer one's freeze
    assert gc.get_freeze_count() == 0 and not heap.active


def test_someone_elses_freeze_and_a_disabled_collector_are_left_alone():
    gc.freeze()
    try:
        n = gc.get_freeze_count()
        with FrozenHeap().during() as froze:
            assert not froze
        assert gc.get_freeze_count() == n
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with FrozenHeap().during() as froze:
            assert not froze and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_an_engine_run_freezes_while_it_generates(tmp_path):
    base = build_base(tmp_path / "base")
    build_tokenizer(base)
    engine = Engine(EngineConfig(model=str(base), device="cpu"), {})
    try:
        sp = SamplingParams(max_tokens=3, ignore_eos=True, logprobs=2)
        reqs = [Request(key=i, id=str(i), prompt_token_ids=[5, 6 + i], sampling=sp) for i in range(3)]
        seen = [gc.get_freeze_count() for _ in engine.generate(reqs)]
        assert len(seen) == 3 and min(seen) > 0 and gc.get_freeze_count() == 0
        gen = engine.generate(reqs)
        next(gen)  # a run abandoned after its first result: closing it gives the heap back
        assert gc.get_freeze_count() > 0
        gen.close()
        assert gc.get_freeze_count() == 0
        gen = engine.generate(reqs)
        next(gen)  # one never closed: the engine's close thaws the heap
    finally:
        engine.close()
    assert gc.get_freeze_count() == 0
    gen.close()
