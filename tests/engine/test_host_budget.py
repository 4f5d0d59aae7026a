"""The host cache's default size (engine/host_budget.py): every adapter when they fit the pinned share of host
memory, fewer with a warning when not, a given --max-cpu-loras kept with a warning when it cannot fit, and what
`multilora run` sets from pre-flight's header scans."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from multilora_cli.engine.host_budget import choose_max_cpu_loras, host_memory_bytes

GIB = 2**30
MB = 10**6


def test_host_memory_is_known():
    assert host_memory_bytes() > 256 * 2**20


def test_all_fit_on_a_large_host():
    c = choose_max_cpu_loras([int(22.5 * MB)] * 1000, 256, None, host_bytes=128 * GIB)  # 1B shapes: 22.5 GB
    assert c.max_cpu_loras == 1000 and c.warning is None and "1000 adapters" in c.reason


def test_too_many_for_the_host_are_capped_with_a_warning():
    # Llama-3-8B rank 16 (84 MB): 32 GiB hold 409 blocks, 204 of them kept for 256 reads in flight
    c = choose_max_cpu_loras([84 * MB] * 1000, 256, None, host_bytes=128 * GIB)
    assert c.max_cpu_loras == 409 - 204
    assert "holds 205 of 1000 adapters" in c.warning and "read from disk" in c.warning
    fewer_slots = choose_max_cpu_loras([84 * MB] * 1000, 16, None, host_bytes=128 * GIB)
    assert fewer_slots.max_cpu_loras == 409 - 16


def test_a_given_count_is_kept_and_warned_about_when_it_cannot_fit():
    ok = choose_max_cpu_loras([84 * MB] * 1000, 16, 100, host_bytes=128 * GIB)
    assert ok.max_cpu_loras == 100 and ok.warning is None
    big = choose_max_cpu_loras([84 * MB] * 1000, 16, 1000, host_bytes=128 * GIB)
    assert big.max_cpu_loras == 1000 and "--max-cpu-loras 1000 does not fit" in big.warning


def test_a_run_sizes_its_host_cache_from_the_scans(capsys):
    from multilora_cli.run.config import EngineFlags, RunConfig
    from multilora_cli.run.setup import engine_config
    from tests.engine.test_slot_budget import LLAMA3_8B

    # 1 MB each once packed in bf16; plain LoRA
    scan = SimpleNamespace(stored_dtype=torch.float32, stored_nbytes=2 * MB, config=SimpleNamespace(use_dora=False))
    good = {f"a{i}": None for i in range(300)}
    pf = SimpleNamespace(
        max_loras=8, max_lora_rank=16, model_config=LLAMA3_8B, model_path="/m", scans={n: scan for n in good}
    )
    run = RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(device="cpu"))
    econf, slots = engine_config(run, pf, good)
    assert econf.max_cpu_loras == 300 and "300 adapters" in slots.to_dict()["host_cache"]
    told = RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(device="cpu", max_cpu_loras=10))
    assert engine_config(told, pf, good)[0].max_cpu_loras == 10
    assert "warning" not in capsys.readouterr().err


def test_a_small_input_sizes_slots_and_host_cache_for_the_adapters_its_lines_can_name(tmp_path):
    """300 adapters in the folder, 3 lines (one asking n=2): at most 4 adapters can be named, so the CPU default
    slots and the host cache (and with it the page-locked arena) hold 4, not 300."""
    from multilora_cli.run.config import EngineFlags, RunConfig
    from multilora_cli.run.setup import engine_config
    from tests.engine.test_slot_budget import LLAMA3_8B

    scan = SimpleNamespace(stored_dtype=torch.float32, stored_nbytes=2 * MB, config=SimpleNamespace(use_dora=False))
    good = {f"a{i}": None for i in range(300)}
    pf = SimpleNamespace(
        max_loras=8, max_lora_rank=16, model_config=LLAMA3_8B, model_path="/m", scans={n: scan for n in good}
    )
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"adapter": "a1", "prompt": "x"}\n{"adapter": "a7", "prompt": "y", "n": 2}\n{"prompt": "z"}\n')
    econf, slots = engine_config(RunConfig(str(inp), adapters=["x"], engine=EngineFlags(device="cpu")), pf, good)
    assert econf.max_decode_batch == 4 and econf.max_loras == 4 and econf.max_cpu_loras == 4
    assert "4 adapters" in slots.to_dict()["host_cache"]
