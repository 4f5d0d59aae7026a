"""Decode-graph captures beside another thread's CUDA work (run through the device tool; skipped without a GPU).

A lazy capture runs inside a step while the prefetch threads read adapters into the pinned arena (querying its
blocks' events) and stage them on their own stream (engine/staging.py). In torch's default "global" capture mode
CUDA refuses such calls from any thread during a capture and the capture fails (pytorch/pytorch#104555: a
watchdog thread's cudaEventQuery); engine/cuda_graphs.py captures in "thread_local" mode. Here a thread copies on
its own stream and queries events, non-stop, while every bucket is captured; then the graphs give HF + PEFT's
tokens.
"""

from __future__ import annotations

import threading

import pytest
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from tests.builders import build_mixed
from tests.engine.test_engine_generate import _hf_greedy, _prompts, _requests

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _hammer(stop: threading.Event, seen: list, errors: list) -> None:
    """What a prefetch thread does: an async copy from page-locked memory on its own stream, an event recorded
    after it and queried, until `stop`."""
    try:
        side = torch.cuda.Stream()
        src = torch.ones(1 << 20, pin_memory=True)
        dst = torch.empty(1 << 20, device="cuda")
        while not stop.is_set():
            with torch.cuda.stream(side):
                dst.copy_(src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(side)
            ev.query()
            seen[0] += 1
        side.synchronize()
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_capture_beside_a_thread_querying_events(tmp_path):
    base, adapters = build_mixed(tmp_path / "m", "llama")
    plan = ["qv8", None, "all4rs", "mlp16", "qv8", None]
    prompts = _prompts(len(plan), seed=3)
    want = _hf_greedy(base, adapters, prompts, plan)
    cfg = EngineConfig(
        model=str(base), device="cuda", dtype="float32", max_loras=3, max_lora_rank=16, max_num_seqs=16,
        num_kv_blocks=256, lazy_capture=True,
    )  # fmt: skip
    engine = Engine(cfg, adapters)
    try:
        graphs = engine.runner.graphs
        assert graphs is not None and not graphs.graphs  # lazy: nothing captured yet
        stop, seen, errors = threading.Event(), [0], []
        t = threading.Thread(target=_hammer, args=(stop, seen, errors))
        t.start()
        try:
            while seen[0] == 0 and t.is_alive():  # the thread is issuing CUDA calls before the capture begins
                pass
            graphs.capture()  # every bucket
        finally:
            stop.set()
            t.join()
        assert not errors, f"the other thread's CUDA calls failed during the capture: {errors[0]!r}"
        assert sorted(graphs.graphs) == graphs.sizes and seen[0] > 0
        engine.runner.step_log = []
        got = [r.token_ids for r in engine.generate_all(_requests(prompts, plan))]
        assert got == want
        assert any(s.graph for s in engine.runner.step_log)  # the captured graphs ran
    finally:
        engine.close()
