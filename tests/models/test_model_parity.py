"""Logits parity with transformers: packed prefill + paged decode, chunked prefill, sliding window."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.layers.attention import Attention
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model

from conftest import ARCHS
from models_helpers import Blocks, hf_greedy, prompts, run_decode, run_prefill

ATOL = 1e-4
DECODE_STEPS = 4


def _load(path):
    import transformers as tf

    cfg = ModelConfig.from_dir(path)
    ours = load_model(path, cfg, dtype=torch.float32, device="cpu")
    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return cfg, ours, hf


def _check_generation(ours, hf, vocab: int, lengths: list[int], block_size: int) -> None:
    """Packed prefill of len(lengths) sequences, then DECODE_STEPS batched decodes fed HF's greedy tokens."""
    seqs = prompts(lengths, vocab)
    refs = [hf_greedy(hf, p, DECODE_STEPS) for p in seqs]
    blocks = Blocks(64, block_size)
    ours.allocate_kv_cache(64, block_size)

    logits = run_prefill(ours, blocks, {i: (p, 0) for i, p in enumerate(seqs)})
    start = 0
    for p, (_, ref) in zip(seqs, refs):
        torch.testing.assert_close(logits[start:start + len(p)], ref[:len(p)], atol=ATOL, rtol=0)
        start += len(p)

    for step in range(DECODE_STEPS):
        feed = {i: (gen[step], len(p) + step) for i, (p, (gen, _)) in enumerate(zip(seqs, refs))}
        logits = run_decode(ours, blocks, feed)
        for i, (p, (gen, ref)) in enumerate(zip(seqs, refs)):
            torch.testing.assert_close(logits[i], ref[len(p) + step], atol=ATOL, rtol=0)
            if step + 1 < DECODE_STEPS:
                assert int(logits[i].argmax()) == gen[step + 1]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_decode_match_hf(base_path, arch):
    cfg, ours, hf = _load(base_path(arch))
    _check_generation(ours, hf, cfg.vocab_size, [7, 13, 3], block_size=4)


@pytest.mark.parametrize("arch,triton", [("llama3", False), ("qwen3", False), ("qwen3", True)])
def test_chunked_prefill_with_cached_prefix(base_path, monkeypatch, arch, triton):
    """Second halves attend to first halves read back from the cache; a fresh sequence rides along."""
    monkeypatch.setattr(Attention, "use_triton", triton)
    cfg, ours, hf = _load(base_path(arch))
    a, b, c = prompts([10, 17, 6], cfg.vocab_size, seed=3)
    ref = {k: hf(torch.tensor([p])).logits[0] for k, p in (("a", a), ("b", b), ("c", c))}
    blocks = Blocks(64, 4, seed=1)
    ours.allocate_kv_cache(64, 4)

    first = run_prefill(ours, blocks, {0: (a[:5], 0), 1: (b[:9], 0)})
    torch.testing.assert_close(first[:5], ref["a"][:5], atol=ATOL, rtol=0)
    torch.testing.assert_close(first[5:], ref["b"][:9], atol=ATOL, rtol=0)
    second = run_prefill(ours, blocks, {0: (a[5:], 5), 2: (c, 0), 1: (b[9:], 9)})
    torch.testing.assert_close(second[:5], ref["a"][5:], atol=ATOL, rtol=0)
    torch.testing.assert_close(second[5:11], ref["c"], atol=ATOL, rtol=0)
    torch.testing.assert_close(second[11:], ref["b"][9:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("triton", [False, True])
def test_sliding_window_matches_hf(base_path, monkeypatch, triton):
    """Mistral with a 5-token window: prompts longer than the window, decode past it."""
    monkeypatch.setattr(Attention, "use_triton", triton)
    cfg, ours, hf = _load(base_path("mistral", sliding_window=5))
    assert cfg.sliding_window == 5
    _check_generation(ours, hf, cfg.vocab_size, [9, 4, 12], block_size=4)


def test_triton_path_on_cpu_matches_hf(base_path, monkeypatch):
    """The GPU code path (Triton k/v store, varlen prefill, paged decode) under TRITON_INTERPRET, end to end."""
    monkeypatch.setattr(Attention, "use_triton", True)
    cfg, ours, hf = _load(base_path("qwen3"))
    _check_generation(ours, hf, cfg.vocab_size, [6, 11], block_size=8)


def test_kv_cache_sizes(base_path):
    cfg, ours, _ = _load(base_path("qwen3"))
    ours.allocate_kv_cache(10, 16)
    attn = ours.model.layers[0].self_attn.attn
    assert tuple(attn.k_cache.shape) == (10, 16, cfg.num_key_value_heads, cfg.head_dim)
    per_block = sum(l.self_attn.attn.k_cache[0].nbytes + l.self_attn.attn.v_cache[0].nbytes
                    for l in ours.model.layers)
    assert ours.kv_bytes_per_block(16) == per_block
