"""`n` samples of one prompt through the real engine on CPU (fp32): sample 0 is the request with n=1, sample i
is the request with sample i's seed alone (in any company), greedy samples agree, the prompt's blocks are really
shared and all returned, preemption changes nothing, and one Result carries every sample."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import sample_seed
from tests.builders import build_mixed

SEED = 11
NEW = 7


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("samples"), "llama")


def prompt(length: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (length,), generator=g).tolist()


def req(key: int, ids: list[int], adapter: str | None = None, **sp) -> Request:
    sampling = SamplingParams(**{"max_tokens": NEW, "ignore_eos": True, **sp})
    return Request(key=key, id=f"r{key}", adapter=adapter, prompt_token_ids=ids, sampling=sampling)


def engine(llama, **kw) -> Engine:
    base, adapters = llama
    return Engine(EngineConfig(model=str(base), device="cpu", max_loras=3, max_lora_rank=16, seed=5, **kw), adapters)


HOT = dict(temperature=1.3, top_p=0.95)  # hot enough that the samples differ


def test_samples_are_their_seeds_alone_and_sample_zero_is_n1(llama):
    eng = engine(llama)
    p = prompt(21, seed=1)
    (four,) = eng.generate_all([req(0, p, "qv8", n=4, seed=SEED, **HOT)])
    assert four.error is None and [s.index for s in four.samples] == [0, 1, 2, 3]
    (one,) = eng.generate_all([req(0, p, "qv8", seed=SEED, **HOT)])
    assert four.samples[0].token_ids == one.token_ids and four.samples[0].text == one.text
    alone = [eng.generate_all([req(0, p, "qv8", seed=sample_seed(SEED, i), **HOT)])[0] for i in range(4)]
    assert [s.token_ids for s in four.samples] == [r.token_ids for r in alone]
    assert len({tuple(s.token_ids) for s in four.samples}) > 1  # really sampled
    # top-level fields: sample 0's text, every sample's tokens counted
    assert (four.text, four.token_ids, four.finish_reason) == (one.text, one.token_ids, one.finish_reason)
    assert four.completion_tokens == 4 * NEW == sum(s.completion_tokens for s in four.samples)
    assert four.prompt_tokens == 21 and len(one.samples) == 1 and one.samples[0].token_ids == one.token_ids


def test_samples_are_batch_invariant_among_other_requests_and_adapters(llama):
    """The n=4 request mixed with n=1 and n=3 requests of other adapters (and base, unseeded): every sample
    equals that sample's seed alone, and the neighbours equal themselves alone."""
    eng = engine(llama, max_num_seqs=12)
    p = prompt(18, seed=2)
    mix = [
        req(0, prompt(9, seed=3), "mlp16", **HOT),
        req(1, p, "qv8", n=4, seed=SEED, **HOT),
        req(2, prompt(30, seed=4), None, n=3, **HOT),  # no seed: derived from (engine seed, key)
        req(3, prompt(5, seed=5), "all4rs", seed=2, **HOT),
    ]
    got = eng.generate_all(mix)
    assert [r.error for r in got] == [None] * 4 and [len(r.samples) for r in got] == [1, 4, 3, 1]
    alone = [eng.generate_all([req(1, p, "qv8", seed=sample_seed(SEED, i), **HOT)])[0] for i in range(4)]
    assert [s.token_ids for s in got[1].samples] == [r.token_ids for r in alone]
    (n3,) = eng.generate_all([req(2, prompt(30, seed=4), None, n=3, **HOT)])
    assert [s.token_ids for s in n3.samples] == [s.token_ids for s in got[2].samples]
    for r in (0, 3):
        assert eng.generate_all([mix[r]])[0].token_ids == got[r].token_ids


def test_greedy_n3_gives_three_copies_of_n1(llama):
    eng = engine(llama)
    p = prompt(13, seed=6)
    (three,) = eng.generate_all([req(0, p, "all4rs", n=3)])
    (one,) = eng.generate_all([req(0, p, "all4rs")])
    assert [s.token_ids for s in three.samples] == [one.token_ids] * 3
    assert [s.text for s in three.samples] == [one.text] * 3


def test_n8_prefills_once_and_returns_every_block(llama):
    eng = engine(llama, block_size=4)
    bm = eng.block_manager
    free0, p = bm.num_free_blocks, prompt(26, seed=7)
    (eight,) = eng.generate_all([req(0, p, None, n=8, seed=SEED, **HOT)])
    assert eight.error is None and len(eight.samples) == 8
    # 26 tokens in blocks of 4: the 6 full blocks before the last token are shared by the 7 forks
    assert eng.scheduler.num_forks == 1 and bm.num_shared == 7 * 6
    # allocated: sample 0's 8 blocks (26 + 6 fed tokens), 2 per fork (positions 24 .. 31), no prompt block again
    assert bm.num_allocated == 8 + 7 * 2
    assert bm.num_free_blocks == free0 and eng.scheduler._reserved == 0
    assert eng.stats.requests == 1 and eng.stats.completion_tokens == 8 * NEW and eng.stats.prompt_tokens == 26


def test_preemption_under_a_tiny_cache_changes_no_sample(llama):
    roomy = engine(llama, block_size=4)
    tight = engine(
        llama,
        block_size=4,
        num_kv_blocks=16,
        max_num_seqs=8,
        # reads on the step loop's thread: which rows run together (so whether the cache overflows)
        # must not depend on read timing
        prefetch_threads=0,
    )
    reqs = lambda: [  # noqa: E731
        req(k, prompt(10 + 3 * k, seed=20 + k), ["qv8", None, "mlp16"][k], n=3, seed=k, **HOT) for k in range(3)
    ]
    want, got = roomy.generate_all(reqs()), tight.generate_all(reqs())
    assert [r.error for r in got] == [None] * 3
    assert [[s.token_ids for s in r.samples] for r in got] == [[s.token_ids for s in r.samples] for r in want]
    assert tight.stats.preemptions > 0 and roomy.stats.preemptions == 0
    assert tight.block_manager.num_free_blocks == 16


def test_a_failed_request_with_n_is_one_error_result(llama):
    eng = engine(llama, max_model_len=32)
    got = eng.generate_all([req(0, list(range(3, 40)), None, n=4), req(1, prompt(5), "nope", n=2)])
    assert [r.error.code for r in got] == ["prompt_too_long", "unknown_adapter"]
    assert [r.samples for r in got] == [[], []] and eng.stats.requests == 2 and eng.stats.errors == 2
