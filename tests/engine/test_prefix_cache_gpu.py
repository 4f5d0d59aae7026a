"""The prefix cache on CUDA (skipped without a GPU), fp32, with decode CUDA graphs and without: a mixed-adapter file
of shared prefixes gives the tokens it gives with the cache off, the same prompt under two adapters never shares
KV, and a tight cache (eviction, preemption) changes nothing. Prefill with context (a hit's first chunk starts
past the cached blocks) runs through the paged prefill kernel here, not the CPU path."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed

pytestmark = pytest.mark.gpu

ADAPTERS = ["qv8", None, "all4rs", "mlp16"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("gpu_prefix"), "llama")


def rand(g, n: int) -> list[int]:
    return torch.randint(3, 256, (n,), generator=g).tolist()


def file(n: int = 48) -> list[Request]:
    g = torch.Generator().manual_seed(0)
    heads = [rand(g, 40), rand(g, 70), rand(g, 33)]
    out = []
    for i in range(n):
        ids = heads[i % 3] + rand(g, int(torch.randint(1, 12, (1,), generator=g)))
        sp = {"max_tokens": 12, "ignore_eos": True}
        if i % 5 == 0:
            sp.update(temperature=1.1, seed=i, n=2)
        out.append(
            Request(key=i, id=str(i), adapter=ADAPTERS[i % 4], prompt_token_ids=ids, sampling=SamplingParams(**sp))
        )
    return out


def engine(setup, eager: bool, cache: bool, **kw) -> Engine:
    base, adapters = setup
    cfg = dict(model=str(base), device="cuda", dtype="float32", max_loras=4, max_lora_rank=16, enforce_eager=eager)
    return Engine(EngineConfig(**{**cfg, "num_kv_blocks": 256, "prefix_cache": cache, **kw}), adapters)


def texts(results) -> list:
    return [[s.token_ids for s in r.samples] for r in results]


@pytest.mark.parametrize("eager", [False, True])
def test_cache_on_equals_off_on_cuda(setup, eager):
    on, off = engine(setup, eager, True), engine(setup, eager, False)
    got, want = on.generate_all(file()), off.generate_all(file())
    assert [r.error for r in got] == [None] * len(got)
    assert texts(got) == texts(want)
    assert on.stats.prefix_hit_tokens > 0 and off.stats.prefix_hit_tokens == 0
    tight = engine(setup, eager, True, num_kv_blocks=24, max_num_seqs=8, block_size=8)
    assert texts(tight.generate_all(file())) == texts(want)
    assert tight.block_manager.cache.num_evicted > 0
    for e in (on, off, tight):
        e.close()


def test_same_prompt_under_two_adapters_on_cuda(setup):
    g = torch.Generator().manual_seed(3)
    p = rand(g, 50)
    plan = ["qv8", "all4rs", None, "qv8", "all4rs", None]
    reqs = [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(max_tokens=8, ignore_eos=True))
        for i, a in enumerate(plan)
    ]
    on = engine(setup, False, True)
    got = on.generate_all(reqs)
    assert [r.token_ids for r in got[:3]] == [r.token_ids for r in got[3:]]
    assert len({tuple(r.token_ids) for r in got[:3]}) == 3
    assert on.stats.prefix_hit_tokens == 3 * (49 // 16) * 16  # only each adapter's second copy hits
    on.close()
