"""What a run's input bounds at engine start (CPU): the KV cache holds what the input's sequences can use, and a
cache capped that way gives the tokens of one sized by memory."""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.runner_sizing import input_kv_blocks, precompile_tokens
from tests.builders import build_mixed


def test_input_kv_blocks_hold_every_sequence_at_max_model_len():
    cfg = EngineConfig(model="m", max_decode_batch=14, block_size=16)
    assert input_kv_blocks(cfg, 512) == 14 * (32 + 1) + 14 * 33 // 50 + 2
    assert input_kv_blocks(EngineConfig(model="m", max_decode_batch=2, max_model_len=100), 512) == 2 * 8 + 0 + 2
    assert input_kv_blocks(EngineConfig(model="m"), 512) is None  # stdin: unknown


def test_process_seconds_counts_from_the_process_start():
    import subprocess
    import sys
    import time

    code = "import time; time.sleep(0.3); from multilora_cli.engine.startup import process_seconds as p; print(p())"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    # at most the child's lifetime as this process saw it, not a fixed figure (it was 30 s) that the child's imports
    # could pass on a loaded machine; /proc's start time and uptime come in 10 ms ticks, hence the slack
    assert 0.3 <= float(out) <= wall + 0.02


def test_precompile_tokens_follow_the_prompt_hint():
    assert precompile_tokens(EngineConfig(model="m")) == 8192
    assert precompile_tokens(EngineConfig(model="m", prompt_tokens_hint=120, max_decode_batch=14)) == 134
    assert precompile_tokens(EngineConfig(model="m", prompt_tokens_hint=0, max_decode_batch=1)) == 1
    assert precompile_tokens(EngineConfig(model="m", prompt_tokens_hint=10**6)) == 8192


@pytest.mark.parametrize("n", [1, 3])
def test_a_kv_cache_capped_by_the_input_gives_the_same_tokens(tmp_path, n):
    base, adapters = build_mixed(tmp_path)
    sp = SamplingParams(max_tokens=6, ignore_eos=True, n=n, temperature=0.0 if n == 1 else 1.0, seed=3)
    reqs = [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=[5 + i, 9, 11, 40 + i], sampling=sp)
        for i, a in enumerate(["qv8", None, "all4rs"])
    ]
    got, blocks = {}, {}
    for bound in (None, 3 * n):
        cfg = EngineConfig(model=str(base), device="cpu", max_loras=3, max_decode_batch=bound)
        engine = Engine(cfg, adapters)
        try:
            blocks[bound] = engine.runner.num_blocks
            got[bound] = [[s.token_ids for s in r.samples] for r in engine.generate_all(reqs)]
            stats: dict = {}
            engine.annotate_stats(stats)  # the run's "startup" section (engine/startup.py)
            st = stats["startup"]
            assert st["kv_blocks"] == blocks[bound] and st["precompiled"] == 0  # CPU: no Triton, no precompile
            assert st["first_step_s"] >= st["process_s"] > 0 and "triton_at_start" not in st
            assert st["kernels"] == "torch"  # the CPU path's grouped torch ops
        finally:
            engine.close()
    assert blocks[3 * n] == input_kv_blocks(cfg, engine.runner.model_config.max_position_embeddings)
    assert blocks[3 * n] < blocks[None]
    assert got[3 * n] == got[None]
