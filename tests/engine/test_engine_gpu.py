"""The engine on CUDA (run through the device tool; skipped without a GPU).

fp32 on CUDA: greedy tokens equal HF + PEFT exactly, with decode CUDA graphs and without, and a request
alone equals the same request in a mixed batch. bf16: HF's fp32 greedy token is reproduced wherever HF's own
top-1 margin is clear of bf16 rounding, and most tokens of whole sequences agree.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed, hf_greedy_margins

pytestmark = pytest.mark.gpu

PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None, "mlp16", "all4rs", "qv8", "mlp16", None, "all4rs"]
NEW = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("gpu_engine"), "llama")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 256, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _requests(prompts, plan, sampled: bool = False) -> list[Request]:
    def sp(i):
        if not sampled or i % 3 == 0:
            return SamplingParams(max_tokens=NEW, ignore_eos=True)
        extra = dict(top_p=0.9, top_k=40) if i % 3 == 2 else {}
        return SamplingParams(max_tokens=NEW, ignore_eos=True, temperature=1.0, seed=i, **extra)

    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=sp(i))
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


@pytest.fixture(scope="module")
def reference(setup):
    base, adapters = setup
    prompts = _prompts(len(PLAN))
    return prompts, hf_greedy_margins(base, adapters, prompts, PLAN, NEW)


@pytest.mark.parametrize("eager", [False, True])
def test_fp32_cuda_tokens_equal_hf_peft(setup, reference, eager):
    base, adapters = setup
    prompts, (want, _) = reference
    engine = Engine(
        EngineConfig(
            model=str(base),
            device="cuda",
            dtype="float32",
            max_loras=3,
            max_lora_rank=16,
            max_num_seqs=16,
            enforce_eager=eager,
            num_kv_blocks=256,
        ),
        adapters,
    )
    assert (engine.runner.graphs is None) == eager
    assert engine.arena is not None and engine.arena.registered  # packed adapters in page-locked memory
    assert engine.runner.precompiled > 0  # the Triton kernels were compiled (or loaded) before the first step
    engine.runner.step_log = []
    got = engine.generate_all(_requests(prompts, PLAN))
    assert [r.error for r in got] == [None] * len(PLAN)
    assert [r.token_ids for r in got] == want
    if not eager:  # the decode steps really replayed graphs
        assert any(s.graph for s in engine.runner.step_log)
    # each step's device time (timing events around its work) and its queueing time were recorded
    assert all(s.gpu_seconds > 0 and 0 < s.enqueue_seconds for s in engine.runner.step_log)
    # alone == batched (graphs at bucket 1 vs a larger bucket, other adapters around)
    alone = [engine.generate_all([r])[0].token_ids for r in _requests(prompts[:4], PLAN[:4])]
    assert alone == want[:4]
    engine.close()


@pytest.mark.parametrize("eager", [False, True])
def test_run_ahead_gives_the_same_tokens(setup, reference, eager):
    """Decode steps launched before the previous step's ids are read back (EngineConfig.run_ahead: ids fed on the
    device, into the graph's buffers or the eager inputs) give the same bf16 tokens as one step at a time, and
    the fp32 tokens equal HF + PEFT's; with seeded sampling mixed in ("sampled"), the same bf16 tokens too."""
    base, adapters = setup
    prompts, (want, _) = reference
    got = {}
    for dtype in ("bfloat16", "float32", "sampled"):
        for ahead in (False, True):
            engine = Engine(
                EngineConfig(
                    model=str(base),
                    device="cuda",
                    max_loras=3,
                    max_lora_rank=16,
                    dtype="bfloat16" if dtype == "sampled" else dtype,
                    max_num_seqs=16,
                    enforce_eager=eager,
                    num_kv_blocks=256,
                    run_ahead=ahead,
                ),
                adapters,
            )
            res = engine.generate_all(_requests(prompts, PLAN, sampled=dtype == "sampled"))
            assert [r.error for r in res] == [None] * len(PLAN)
            got[dtype, ahead] = [r.token_ids for r in res]
            assert (engine.scheduler.num_ahead_steps > 0) == ahead
            engine.close()
        assert got[dtype, True] == got[dtype, False]
    assert got["float32", True] == want
    assert got["sampled", True] != got["bfloat16", True]  # the sampled rows really sampled


def test_bf16_cuda_close_to_hf_fp32(setup, reference):
    base, adapters = setup
    prompts, (want, margins) = reference
    engine = Engine(
        EngineConfig(
            model=str(base),
            device="cuda",
            dtype="bfloat16",
            max_loras=3,
            max_lora_rank=16,
            max_num_seqs=16,
            num_kv_blocks=256,
        ),
        adapters,
    )
    got = engine.generate_all(_requests(prompts, PLAN))
    assert [r.error for r in got] == [None] * len(PLAN)
    clear = [i for i, m in enumerate(margins) if m[0] > 0.05]
    assert len(clear) >= len(PLAN) // 2
    assert all(got[i].token_ids[0] == want[i][0] for i in clear)
    same = sum(a == b for r, w in zip(got, want) for a, b in zip(r.token_ids, w))
    assert same >= 0.75 * NEW * len(PLAN)
    engine.close()


def test_slot_pressure_with_graphs(setup, reference):
    """3 adapters through 1 slot on CUDA (loads between graph replays): same tokens as the roomy run."""
    base, adapters = setup
    prompts, (want, _) = reference
    engine = Engine(
        EngineConfig(
            model=str(base),
            device="cuda",
            dtype="float32",
            max_loras=1,
            max_lora_rank=16,
            max_num_seqs=4,
            num_kv_blocks=256,
        ),
        adapters,
    )
    got = engine.generate_all(_requests(prompts, PLAN))
    assert [r.token_ids for r in got] == want
    assert engine.stats.slot_evictions >= 2
    engine.close()


@pytest.mark.parametrize("pinned", [True, False])
def test_reloads_through_a_small_host_cache(setup, reference, pinned):
    """1 slot, 1 host-cached adapter, requests fed two at a time: adapters come back after others, so they are
    re-read and re-packed, and arena blocks are given back and reused while earlier copies from them may still
    be in flight; pageable packing (no arena) gives the same tokens."""
    base, adapters = setup
    prompts, (want, _) = reference
    engine = Engine(
        EngineConfig(
            model=str(base),
            device="cuda",
            dtype="float32",
            max_loras=1,
            max_cpu_loras=1,
            max_lora_rank=16,
            max_num_seqs=4,
            num_kv_blocks=256,
            pinned_arena=pinned,
        ),
        adapters,
    )
    reqs = _requests(prompts, PLAN)
    got = []
    for i in range(0, len(reqs), 2):  # qv8, then all4rs + mlp16, then qv8 again (evicted from host by then) ...
        got += engine.generate_all(reqs[i : i + 2])
    assert [r.token_ids for r in got] == want
    assert engine.slots.cpu_loads > len(adapters)  # adapters were re-read and re-packed
    assert (engine.arena is not None) == pinned
    if pinned:  # every pack took an arena block or fell back to pageable memory (never an error)
        st = engine.arena.stats()
        assert st["blocks"] >= len(adapters) and st["blocks"] + st["fallbacks"] >= engine.slots.cpu_loads
    engine.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_direct_file_reads_serve_the_adapters(setup, reference, monkeypatch, dtype):
    """On CUDA adapters go file -> arena block (engine/direct_read.py; fp32 files: as stored, bf16: converted), and
    without the page-locked arena (pinned_arena=False) file -> a pageable buffer by the same reader; the tokens of
    the two runs are equal, and HF's in fp32."""
    from multilora_cli.engine import direct_read

    base, adapters = setup
    prompts, (want, _) = reference
    real, hits = direct_read.read_packed, []

    def counted(*a, **kw):
        out = real(*a, **kw)
        hits.append(out is not None)
        return out

    monkeypatch.setattr(direct_read, "read_packed", counted)
    from multilora_cli.adapters.scan import scan_adapter

    scans = {n: scan_adapter(p, n) for n, p in adapters.items()}  # as pre-flight hands them over (run/job.py)
    runs = {}
    for direct in (True, False):
        engine = Engine(
            EngineConfig(
                model=str(base),
                device="cuda",
                dtype=dtype,
                max_loras=3,
                max_lora_rank=16,
                max_num_seqs=16,
                num_kv_blocks=256,
                pinned_arena=direct,
            ),
            adapters,
            scans=scans,
        )
        assert (engine.arena is not None) == direct
        if direct:  # planned from the given scans: no adapter scanned a second time
            assert set(engine._read_plans) == set(scans)
            assert all(rp.scan is scans[n] for n, rp in engine._read_plans.items())
        got = engine.generate_all(_requests(prompts, PLAN))
        assert [r.error for r in got] == [None] * len(PLAN)
        runs[direct] = [r.token_ids for r in got]
        engine.close()
    # every adapter read directly once a run: into an arena block, then into a pageable buffer
    assert all(hits) and len(hits) == 2 * len(adapters)
    assert runs[True] == runs[False]
    if dtype == "float32":
        assert runs[True] == want
