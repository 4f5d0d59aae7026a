"""Prefix caching end to end on CPU: outputs never change with the cache on, KV never crosses adapters, and the
hit counts are exactly the full blocks a prompt shares with one computed before it under the same adapter.

Each engine runs the same file with `prefix_cache` on and off (engine/block_manager.py, engine/prefix_order.py);
the reference is HF transformers + PEFT (tests/engine/test_engine_generate.py's greedy loop)."""

from __future__ import annotations

import shutil

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed
from tests.engine.test_engine_generate import NEW, _hf_greedy

BS = 4  # small blocks: prompts of 10-30 tokens span several
ADAPTERS = ["qv8", None, "all4rs", "mlp16"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("llama"), "llama")


def _rand(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, 256, (n,), generator=g).tolist()


def shared_file(n: int = 24, seed: int = 0) -> tuple[list[list[int]], list[str | None]]:
    """n prompts over ADAPTERS (interleaved), each one of three shared prefixes (13, 9 and 16 tokens; the same
    tokens under every adapter, so only the adapter tells their KV apart) + 0-5 tokens of its own; a few repeat
    an earlier prompt exactly."""
    g = torch.Generator().manual_seed(seed)
    heads = [_rand(g, 13), _rand(g, 9), _rand(g, 16)]
    prompts, plan = [], []
    for i in range(n):
        p = heads[i % 3] + _rand(g, int(torch.randint(0, 6, (1,), generator=g)))
        if i % 7 == 6:
            p = list(prompts[i - 4])  # the same prompt as an earlier request (same adapter: 4 apart)
        prompts.append(p)
        plan.append(ADAPTERS[i % 4])
    return prompts, plan


def expected_hits(prompts, plan) -> int:
    """Hit tokens of a roomy cache in prefix order: each adapter's prompts sorted (they run in trie order,
    engine/prefix_order.py), each starts from the full blocks it shares with the one before it (in sorted order the
    longest shared prefix among those before it), never its last token's block."""
    total = 0
    for a in set(plan):
        mine = sorted(p for p, q in zip(prompts, plan) if q == a)
        for prev, cur in zip(mine, mine[1:]):
            k = 0
            while k < (len(cur) - 1) // BS and cur[k * BS : (k + 1) * BS] == prev[k * BS : (k + 1) * BS]:
                k += 1
            total += k * BS
    return total


def requests(prompts, plan, **sampling) -> list[Request]:
    sp = {"max_tokens": NEW, "ignore_eos": True, **sampling}
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(**sp))
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def engine(base, adapters, cache: bool, **kw) -> Engine:
    cfg = dict(model=str(base), device="cpu", max_loras=4, max_lora_rank=16, block_size=BS, seed=3, **kw)
    return Engine(EngineConfig(**cfg, prefix_cache=cache), adapters)


def run_both(base, adapters, reqs_of, **kw):
    """(results with the cache, results without, the caching engine)."""
    on = engine(base, adapters, True, **kw)
    off = engine(base, adapters, False, **kw)
    got_on, got_off = on.generate_all(reqs_of()), off.generate_all(reqs_of())
    assert [r.error for r in got_on] == [None] * len(got_on)
    assert off.stats.prefix_hit_tokens == 0
    return got_on, got_off, on


def test_greedy_equals_cache_off_and_hf_peft(llama):
    base, adapters = llama
    prompts, plan = shared_file()
    on, off, eng = run_both(base, adapters, lambda: requests(prompts, plan))
    assert [r.token_ids for r in on] == [r.token_ids for r in off] == _hf_greedy(base, adapters, prompts, plan)
    st = eng.stats
    assert st.prefix_prompt_tokens == sum(map(len, prompts)) == st.prompt_tokens
    assert st.prefix_hit_tokens == expected_hits(prompts, plan) > 8 * len(prompts) // 2
    d = st.to_dict()["prefix_cache"]
    assert d == {
        "prompt_tokens": st.prefix_prompt_tokens,
        "hit_tokens": st.prefix_hit_tokens,
        "hit_rate": st.prefix_hit_tokens / st.prefix_prompt_tokens,
    }


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.9, "top_p": 0.9, "seed": 7, "repetition_penalty": 1.3}, {"temperature": 1.2, "n": 3}]
)
def test_seeded_sampling_and_n_samples_equal_cache_off(llama, sampling):
    """Seeded sampling with a penalty (its history counts the whole prompt, cached or not) and engine-seeded
    sampling; n=3 samples fork from a sample 0 that started from cached blocks."""
    base, adapters = llama
    prompts, plan = shared_file(16, seed=1)
    on, off, eng = run_both(base, adapters, lambda: requests(prompts, plan, **sampling))
    assert [[s.token_ids for s in r.samples] for r in on] == [[s.token_ids for s in r.samples] for r in off]
    assert eng.stats.prefix_hit_tokens > 0
    assert len({tuple(r.token_ids) for r in on}) > 1


def test_same_prompt_never_shares_kv_across_adapters(llama, tmp_path):
    """One prompt under every adapter, twice each, and under a byte-for-byte copy of one adapter's folder: the
    second copy under the same adapter (or its copy: identity is content, not name) hits, and nothing else does.
    Were the adapter left out of the key, the first request under each other adapter would hit too."""
    base, adapters = llama
    twin = tmp_path / "qv8-copy"
    shutil.copytree(adapters["qv8"], twin)
    ads = {**adapters, "twin": twin}
    prompt = _rand(torch.Generator().manual_seed(5), 18)  # 4 full blocks before its last token
    plan = ["qv8", "all4rs", "mlp16", None, "qv8", "all4rs", "mlp16", None, "twin"]
    prompts = [prompt] * len(plan)
    on, off, eng = run_both(base, ads, lambda: requests(prompts, plan))
    want = _hf_greedy(base, adapters, prompts, [a if a != "twin" else "qv8" for a in plan])
    assert [r.token_ids for r in on] == [r.token_ids for r in off] == want
    assert len({tuple(w) for w in want}) == 4  # each adapter (and the base) gives its own text
    assert eng.stats.prefix_hit_tokens == 5 * 16  # the 2nd of each (4) and the twin: 4 blocks of 4 each


def test_hit_counts_exact(llama):
    """Base rows, blocks of 4: A = S(8) + a(3), D = S + d(5), A again, C (another first block), E = D + e(4).
    In prefix order (A, A, D, E; C in its own group): the second A takes S's 2 blocks (its third is not full
    before its last token), D takes S's 2 blocks, C none, E D's 3 prompt blocks (D's fourth block holds D's
    generated token, not e's)."""
    base, adapters = llama
    g = torch.Generator().manual_seed(8)
    s, a, d, c, e = _rand(g, 8), _rand(g, 3), _rand(g, 5), _rand(g, 11), _rand(g, 4)
    d[0] = a[0] + 1 if a[0] < 255 else 3  # D leaves S's blocks at its first token, and sorts after A
    prompts = [s + a, s + d, s + a, c, s + d + e]
    on, off, eng = run_both(base, adapters, lambda: requests(prompts, [None] * 5, max_tokens=2))
    assert [r.token_ids for r in on] == [r.token_ids for r in off]
    assert eng.stats.prefix_prompt_tokens == 11 + 13 + 11 + 11 + 17
    assert eng.stats.prefix_hit_tokens == 8 + 8 + 0 + 12 == expected_hits(prompts, [None] * 5)


def test_eviction_and_preemption_under_a_small_kv_cache(llama):
    """12 blocks of 4 for 24 requests of up to 21 + 6 tokens: cached blocks are evicted to make room, running
    sequences are preempted and recomputed (from their cached blocks when still there): same tokens as with
    the cache off, and as a roomy run."""
    base, adapters = llama
    prompts, plan = shared_file()
    on, off, eng = run_both(
        base, adapters, lambda: requests(prompts, plan), num_kv_blocks=12, max_num_seqs=4, prefetch_threads=0
    )
    roomy = engine(base, adapters, True).generate_all(requests(prompts, plan))
    assert [r.token_ids for r in on] == [r.token_ids for r in off] == [r.token_ids for r in roomy]
    assert eng.block_manager.cache.num_evicted > 0
    assert eng.stats.preemptions > 0
    assert eng.stats.prefix_hit_tokens > 0


@pytest.mark.slow  # builds a model and three adapters per arch
@pytest.mark.parametrize("arch", ["phi3-longrope", "gemma2"])
def test_longrope_and_sliding_window_equal_hf(tmp_path, arch):
    """phi3-longrope switches to its long factors past 12 tokens: prompts of 7-11 tokens (rewritten long in place
    when they grow past 12: they take no part) and of 17-21 (rotated long from the start: they share). gemma2:
    a 5-token sliding window that the shared prefixes run past."""
    base, adapters = build_mixed(tmp_path, arch)
    g = torch.Generator().manual_seed(2)
    short, long_ = _rand(g, 6), _rand(g, 16)
    prompts = [(short if i % 2 else long_) + _rand(g, 1 + i % 5) for i in range(12)]
    plan = [ADAPTERS[i % 4] for i in range(12)]
    on, off, eng = run_both(base, adapters, lambda: requests(prompts, plan))
    assert [r.token_ids for r in on] == [r.token_ids for r in off] == _hf_greedy(base, adapters, prompts, plan)
    part = [i for i, p in enumerate(prompts) if arch != "phi3-longrope" or len(p) > 12]  # who takes part
    want = expected_hits([prompts[i] for i in part], [plan[i] for i in part])
    assert eng.stats.prefix_hit_tokens == want > 0


def test_prompt_logprobs_and_scoring_lines_compute_their_whole_prompt(llama):
    """A line that needs its prompt's logits (prompt_logprobs, a scoring line) takes no hit though its prefix is
    cached, and gets the cache-off numbers; its blocks still serve the plain line after it."""
    base, adapters = llama
    prompt = _rand(torch.Generator().manual_seed(9), 18)

    def reqs():
        sp = {"max_tokens": 3, "ignore_eos": True}
        return [
            Request(key=0, id="0", adapter="qv8", prompt_token_ids=prompt, sampling=SamplingParams(**sp)),
            Request(
                key=1, id="1", adapter="qv8", prompt_token_ids=prompt, sampling=SamplingParams(**sp, prompt_logprobs=2)
            ),
            Request(key=2, id="2", adapter="qv8", prompt="w5 w9 w11 w30", continuation=" w40 w41"),
            Request(key=3, id="3", adapter="qv8", prompt="w5 w9 w11 w30", continuation=" w40 w41"),
            Request(key=4, id="4", adapter="qv8", prompt_token_ids=prompt, sampling=SamplingParams(**sp)),
        ]

    on, off, eng = run_both(base, adapters, reqs, max_num_seqs=1)  # one at a time: each finds the others' blocks
    for a, b in zip(on[1].prompt_logprobs[1:], off[1].prompt_logprobs[1:]):
        assert a.id == b.id and abs(a.logprob - b.logprob) < 1e-5 and [t[0] for t in a.top] == [t[0] for t in b.top]
    assert on[2].score.token_logprobs == pytest.approx(off[2].score.token_logprobs, abs=1e-5)
    assert on[3].score.token_logprobs == pytest.approx(off[2].score.token_logprobs, abs=1e-5)
    # hits: only the plain line 4 (its 4 full blocks before the last token), none for lines 1-3
    assert eng.stats.prefix_hit_tokens == 4 * BS
