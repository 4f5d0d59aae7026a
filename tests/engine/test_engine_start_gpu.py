"""An engine on a real model shape with the default KV sizing starts, precompiles and generates (GPU only).

Every other GPU test fixes num_kv_blocks, so none left the dry-run precompile only the headroom the default
sizing leaves (1 - gpu_memory_utilization of the device plus an activation estimate). The dry run held every
recorded launch's tensors (all activations of every dry prefill) and ran out of memory at engine start:
Llama-3-8B with 64 rank-64 slots on an H200, and any large enough model at the defaults.
"""

from __future__ import annotations

import gc

import pytest
import torch

from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.precompile import prefill_sizes
from multilora_cli.engine.request import Request
from multilora_cli.engine.runner_sizing import precompile_tokens

pytestmark = pytest.mark.gpu


def test_default_kv_sizing_leaves_room_for_the_precompile(tmp_path):
    model_dir = write_model_dir("llama-3.2-1b", tmp_path / "model")
    engine = Engine(EngineConfig(model=str(model_dir), device="cuda", load_format="dummy", max_num_seqs=32))
    try:
        assert engine.runner.precompiled > 0, "the dry run must have recorded the kernels"
        free, total = torch.cuda.mem_get_info()
        assert free > 0.02 * total, "the KV sizing must leave the step's headroom free after the precompile"
        sp = SamplingParams(max_tokens=4, ignore_eos=True)
        out = engine.generate_all(
            [Request(key=i, id=str(i), prompt_token_ids=[5 + i, 9, 11], sampling=sp) for i in range(3)]
        )
        assert [r.error for r in out] == [None] * 3 and all(len(r.token_ids) == 4 for r in out)
    finally:
        del engine
        gc.collect()
        torch.cuda.empty_cache()


def test_graphs_cover_only_the_buckets_the_input_can_reach(tmp_path):
    """max_decode_batch (a run's input bound) caps the captured buckets; tokens equal an unbounded engine's."""
    model_dir = write_model_dir("tiny", tmp_path / "model")
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    reqs = [Request(key=i, id=str(i), prompt_token_ids=[5 + i, 9, 11], sampling=sp) for i in range(3)]
    got = {}
    for bound in (None, 3):
        cfg = EngineConfig(
            model=str(model_dir), device="cuda", load_format="dummy", num_kv_blocks=64, max_decode_batch=bound
        )
        engine = Engine(cfg)
        try:
            sizes = engine.runner.graphs.sizes
            assert sizes == [1, 2, 3] if bound else max(sizes) == cfg.max_num_seqs
            got[bound] = [r.token_ids for r in engine.generate_all(reqs)]
        finally:
            engine.close()
            del engine
            gc.collect()
            torch.cuda.empty_cache()
    assert got[3] == got[None]


def test_lazy_capture_gives_the_eager_capture_tokens(tmp_path):
    """Lazy capture (the default) captures a bucket at its first decode step, mid-run with run-ahead on: the
    tokens equal those of an engine that captured every bucket at start, and only the reached buckets exist."""
    model_dir = write_model_dir("tiny", tmp_path / "model")
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    # staggered lengths: the decode batch shrinks 5 -> 1 through buckets 8, 4, 2, 1
    reqs = [
        Request(key=i, id=str(i), prompt_token_ids=[5 + i, 9, 11], sampling=SamplingParams(max_tokens=4 + 2 * i))
        for i in range(5)
    ] + [Request(key=9, id="9", prompt_token_ids=[3, 4], sampling=sp)]
    got, captured = {}, {}
    for lazy in (False, True):
        cfg = EngineConfig(
            model=str(model_dir),
            device="cuda",
            load_format="dummy",
            num_kv_blocks=64,
            max_num_seqs=32,
            lazy_capture=lazy,
        )
        engine = Engine(cfg)
        try:
            assert bool(engine.runner.graphs.graphs) is not lazy  # lazy: nothing captured at start
            got[lazy] = [r.token_ids for r in engine.generate_all(reqs)]
            captured[lazy] = sorted(engine.runner.graphs.graphs)
        finally:
            engine.close()
            del engine
            gc.collect()
            torch.cuda.empty_cache()
    assert got[True] == got[False]
    assert captured[True] and set(captured[True]) < set(captured[False]) and max(captured[True]) <= 8


def test_a_small_input_precompiles_fewer_prefill_variants_and_gives_the_same_tokens(tmp_path):
    """prompt_tokens_hint (io/reader.prompt_token_bound of a run's file) bounds the dry-run prefill sizes: fewer
    sizes are dry-run at start (no more variants compiled: on this tiny model the sizes past the hint share their
    variants with smaller ones, as measured on an H200), and the tokens equal those of an engine that precompiled
    every size."""
    model_dir = write_model_dir("tiny", tmp_path / "model")
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    reqs = [Request(key=i, id=str(i), prompt_token_ids=[5 + i, 9, 11, 12 + i], sampling=sp) for i in range(3)]
    got, variants, sizes = {}, {}, {}
    for hint in (None, 20):
        cfg = EngineConfig(
            model=str(model_dir), device="cuda", load_format="dummy", max_decode_batch=3, prompt_tokens_hint=hint
        )
        engine = Engine(cfg)
        try:
            variants[hint] = engine.runner.precompiled
            sizes[hint] = len(prefill_sizes(precompile_tokens(cfg)))
            got[hint] = [r.token_ids for r in engine.generate_all(reqs)]
            stats: dict = {}
            engine.annotate_stats(stats)
            assert stats["startup"]["kv_blocks"] == engine.runner.num_blocks
        finally:
            engine.close()
            del engine
            gc.collect()
            torch.cuda.empty_cache()
    assert sizes[20] < sizes[None]
    assert 0 < variants[20] <= variants[None]
    assert got[20] == got[None]
