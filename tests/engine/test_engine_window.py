"""The engine on CPU (fp32) with a model whose every layer slides (Mistral's `sliding_window`, Qwen2 with
`use_sliding_window`): KV blocks behind the window are dropped while prompts and generations run several windows
long, and a mixed-adapter batch still gives HF + PEFT's greedy tokens; with n = 2 and prefix-cache hits, and
under preemption with a cache smaller than one sequence's whole KV. Gemma 2 / 3 mix full layers in: no window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.block_manager import cdiv
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.runner_sizing import input_kv_blocks, window_kv_blocks
from multilora_cli.models.config import ModelConfig
from tests.builders import build_adapter, build_base, build_tokenizer, mixed_adapters, tiny_config
from tests.engine.test_engine_generate import _hf_greedy

W, BS, BUDGET = 8, 4, 16
PLAN = ["qv8", None, "all4rs", "mlp16", "qv8", None]
WINDOWED = {  # arch -> tiny_config overrides: every layer slides with W
    "mistral": dict(sliding_window=W),
    "qwen2": dict(use_sliding_window=True, sliding_window=W, max_window_layers=0),
}


def build_windowed(root: Path, arch: str) -> tuple[Path, dict[str, Path]]:
    """A tiny `arch` base whose every layer slides with W, its tokenizer, and the three mixed PEFT adapters."""
    base = build_base(root / "base", arch, **WINDOWED[arch])
    build_tokenizer(base)
    return base, {n: build_adapter(base, root / n, **kw) for n, kw in mixed_adapters(arch).items()}


def _prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 256, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _requests(prompts, plan, new: int, **sp) -> list[Request]:
    return [
        Request(
            key=i,
            id=str(i),
            adapter=a,
            prompt_token_ids=p,
            sampling=SamplingParams(max_tokens=new, ignore_eos=True, **sp),
        )
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def _engine(base, adapters, **kw) -> Engine:
    base_kw = dict(model=str(base), device="cpu", max_loras=4, max_lora_rank=16, block_size=BS)
    return Engine(EngineConfig(**{**base_kw, "max_num_batched_tokens": BUDGET, **kw}), adapters)


def _spy_held(engine: Engine) -> list[tuple[int, int]]:
    """Record (blocks held, new tokens) of every sequence of every step, run-ahead ones too, as the step ends (wraps
    this engine's scheduler.postprocess: observation only)."""
    seen: list[tuple[int, int]] = []
    postprocess = engine.scheduler.postprocess

    def spy(batch, *a, **kw):
        seen.extend((len(s.block_table) - s.num_dropped, n) for s, n in zip(batch.seqs, batch.num_new_tokens))
        return postprocess(batch, *a, **kw)

    engine.scheduler.postprocess = spy
    return seen


def test_kv_window_only_when_every_layer_slides():
    win = {a: ModelConfig.from_dict(tiny_config(a, **WINDOWED.get(a, {})).to_dict()).kv_window for a in WINDOWED}
    assert win == {"mistral": W, "qwen2": W}
    assert ModelConfig.from_dict(tiny_config("phi3").to_dict()).kv_window == 7  # Phi-3: every layer
    for arch in ("gemma2", "gemma3", "llama"):  # gemma: global layers among the sliding ones
        assert ModelConfig.from_dict(tiny_config(arch).to_dict()).kv_window is None
    half = tiny_config("qwen2", use_sliding_window=True, sliding_window=W, max_window_layers=1)
    assert ModelConfig.from_dict(half.to_dict()).kv_window is None


def test_window_bounds_the_blocks_a_sequence_needs():
    cfg = EngineConfig(model="m", max_decode_batch=10, block_size=BS, max_num_batched_tokens=BUDGET)
    mistral = ModelConfig.from_dict(tiny_config("mistral", sliding_window=W).to_dict())
    assert window_kv_blocks(cfg, mistral) == cdiv(W - 1 + BUDGET, BS) + 1 == 7
    assert input_kv_blocks(cfg, 512, 7) == 10 * 8 + 80 // 50 + 2  # not 10 * (128 + 1)
    for arch in ("llama", "gemma2", "phi3-longrope"):
        assert window_kv_blocks(cfg, ModelConfig.from_dict(tiny_config(arch).to_dict())) is None
    longrope = tiny_config("phi3-longrope", sliding_window=W).to_dict()
    assert (
        ModelConfig.from_dict(longrope).kv_window == W
        and window_kv_blocks(cfg, ModelConfig.from_dict(longrope)) is None
    )


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_long_generations_with_dropped_blocks_match_hf_peft(tmp_path, arch):
    """Prompts of 17-40 tokens (prefilled in chunks of 16) and 24 generated, window 8, blocks of 4: HF + PEFT's
    greedy tokens for every row of one mixed batch, while a decoding sequence holds at most cdiv(8, 4) + 1 = 3
    blocks (and a prefill chunk at most cdiv(8 - 1 + 16, 4) + 1)."""
    base, adapters = build_windowed(tmp_path, arch)
    prompts = _prompts(len(PLAN), 17, 41, seed=1)
    engine = _engine(base, adapters)
    assert engine.block_manager.window == W
    seen = _spy_held(engine)
    got = engine.generate_all(_requests(prompts, PLAN, 24))
    assert [r.error for r in got] == [None] * len(PLAN)
    assert [r.token_ids for r in got] == _hf_greedy(base, adapters, prompts, PLAN, new=24)
    assert max(h for h, n in seen if n == 1) == cdiv(W, BS) + 1
    assert max(h for h, _ in seen) <= cdiv(W - 1 + BUDGET, BS) + 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return build_windowed(tmp_path_factory.mktemp("mistral_window"), "mistral")


def test_samples_and_prefix_hits_with_dropped_blocks(mistral):
    """n = 2 (greedy: both samples are HF's tokens) of prompts sharing a 22-token prefix per adapter, longer than
    the window: the later requests start from cached blocks, part of them already behind their window, and the
    forks share sample 0's blocks from the prompt's last full block back by the window."""
    base, adapters = mistral
    g = torch.Generator().manual_seed(4)
    head = {a: torch.randint(3, 256, (22,), generator=g).tolist() for a in ("qv8", None)}
    plan = ["qv8", None, "qv8", None, "qv8"]
    prompts = [head[a] + torch.randint(3, 256, (1 + i,), generator=g).tolist() for i, a in enumerate(plan)]
    engine = _engine(base, adapters, max_num_seqs=4)
    got = engine.generate_all(_requests(prompts, plan, 12, n=2))
    assert [r.error for r in got] == [None] * len(plan)
    want = _hf_greedy(base, adapters, prompts, plan, new=12)
    assert [[s.token_ids for s in r.samples] for r in got] == [[w, w] for w in want]
    assert engine.stats.prefix_hit_tokens > 0 and engine.scheduler.num_forks == len(plan)


def test_preemption_in_a_cache_smaller_than_one_sequence(mistral):
    """Four rows of 30-37 + 40 tokens need 18-20 blocks each without a window; 12 blocks serve them (each holds at
    most 7 at once), preempting and recomputing: still HF's tokens."""
    base, adapters = mistral
    prompts = _prompts(4, 30, 38, seed=6)
    plan = PLAN[:4]
    engine = _engine(
        base,
        adapters,
        num_kv_blocks=12,
        max_num_seqs=4,
        # reads on the step loop's thread: which rows run together (so whether the cache overflows)
        # must not depend on read timing
        prefetch_threads=0,
    )
    assert engine.max_model_len == 512  # max_position_embeddings: not capped by the cache's 48 tokens
    got = engine.generate_all(_requests(prompts, plan, 40))
    assert [r.error for r in got] == [None] * 4
    assert [r.token_ids for r in got] == _hf_greedy(base, adapters, prompts, plan, new=40)
    assert engine.scheduler.num_preemptions > 0
