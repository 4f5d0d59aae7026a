"""`n` samples on CUDA in fp32 (skipped without a GPU), with decode CUDA graphs and without: each sample is its
seed alone in a mixed batch, greedy samples equal n=1, and a tight cache (preemption) changes no sample. The
fork's first steps (a forked sample's partial prompt block as a 1-token decode or a chunk with context) run
through the same graph and eager paths as any sequence."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import sample_seed
from tests.builders import build_mixed

pytestmark = pytest.mark.gpu

HOT = dict(temperature=1.3, top_p=0.95)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("gpu_samples"), "llama")


def prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (length,), generator=g).tolist()


def req(key, ids, adapter=None, **sp) -> Request:
    sampling = SamplingParams(**{"max_tokens": 8, "ignore_eos": True, **sp})
    return Request(key=key, id=str(key), adapter=adapter, prompt_token_ids=ids, sampling=sampling)


def engine(setup, eager: bool, **kw) -> Engine:
    base, adapters = setup
    cfg = EngineConfig(
        model=str(base),
        device="cuda",
        dtype="float32",
        max_loras=3,
        max_lora_rank=16,
        enforce_eager=eager,
        **{"num_kv_blocks": 256, **kw},  # not 90% of the card: engines of later GPU tests in this process need it
    )
    return Engine(cfg, adapters)


@pytest.mark.parametrize("eager", [False, True])
def test_samples_on_cuda(setup, eager):
    eng = engine(setup, eager, block_size=16)
    p17, p33 = prompt(17, 1), prompt(33, 2)  # the forks' partial block: 1 token (a decode), 1 token after 2 blocks
    mix = [
        req(0, p17, "qv8", n=4, seed=7, **HOT),
        req(1, prompt(9, 3), "mlp16", seed=1, **HOT),
        req(2, p33, None, n=3),
        req(3, prompt(24, 4), "all4rs", n=2, seed=5, **HOT),  # forks feed 8 tokens: a chunk with context
    ]
    got = eng.generate_all(mix)
    assert [r.error for r in got] == [None] * 4
    alone = [eng.generate_all([req(0, p17, "qv8", seed=sample_seed(7, i), **HOT)])[0] for i in range(4)]
    assert [s.token_ids for s in got[0].samples] == [r.token_ids for r in alone]
    (greedy1,) = eng.generate_all([req(2, p33, None)])
    assert [s.token_ids for s in got[2].samples] == [greedy1.token_ids] * 3
    alone3 = [eng.generate_all([req(3, prompt(24, 4), "all4rs", seed=sample_seed(5, i), **HOT)])[0] for i in range(2)]
    assert [s.token_ids for s in got[3].samples] == [r.token_ids for r in alone3]
    assert eng.generate_all([mix[1]])[0].token_ids == got[1].token_ids
    eng.close()
    # tiny caches: whether a given size preempts depends on admission timing (slot loads, preloads), so a few
    # sizes run and at least one must preempt; every one gives the same samples and ends with every block free
    preempted = 0
    for blocks in (5, 6, 7):
        tight = engine(setup, eager, block_size=16, num_kv_blocks=blocks, max_num_seqs=10)
        again = tight.generate_all([req(k, r.prompt_token_ids, r.adapter, **_sp(r)) for k, r in enumerate(mix)])
        assert [[s.token_ids for s in r.samples] for r in again] == [[s.token_ids for s in r.samples] for r in got]
        assert tight.block_manager.num_free_blocks == blocks
        preempted += tight.stats.preemptions
        tight.close()
    assert preempted > 0


def _sp(r: Request) -> dict:
    s = r.sampling
    return dict(n=s.n, seed=s.seed, temperature=s.temperature, top_p=s.top_p)
