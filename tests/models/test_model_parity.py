"""Logits parity with transformers: packed prefill + paged decode, chunked prefill, sliding window."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.layers.attention import Attention
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model
from tests.builders import ARCHS, hf_model
from tests.devices import needs_interpreter
from tests.models.helpers import Blocks, check_chunked_prefill, check_generation, prompts, run_prefill


def _load(path, triton: bool | None = None):
    """(config, our model, HF's); `triton` set on every Attention module (None: Triton on CUDA tensors only)."""

    cfg = ModelConfig.from_dir(path)
    ours = load_model(path, cfg, dtype=torch.float32, device="cpu")
    for m in ours.modules():
        if isinstance(m, Attention):
            m.use_triton = triton
    hf = hf_model(path)
    return cfg, ours, hf


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "phi3-longrope"])
def test_prefill_and_decode_match_hf(base_path, arch):
    cfg, ours, hf = _load(base_path(arch))
    check_generation(ours, hf, cfg.vocab_size, [7, 13, 3], block_size=4)


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=needs_interpreter)])
def test_longrope_matches_hf_generate(base_path, triton):
    """Phi-3 LongRoPE (long factors from position 12, half-size rotary dim): a prompt past 12 (long factors for
    all its tokens), one that decodes across 12 (short, then long: transformers' choice per forward), a short one;
    against `generate` step by step (a full-sequence forward would choose for every token at once)."""
    cfg, ours, hf = _load(base_path("phi3-longrope"), triton)
    assert cfg.rope_scaling["rope_type"] == "longrope" and cfg.rotary_dim == 8
    check_generation(ours, hf, cfg.vocab_size, [9, 13, 3], block_size=4, steps=5, cached=True)


@pytest.mark.parametrize(
    "arch,triton",
    [
        ("llama3", False),
        ("qwen3", False),
        pytest.param("qwen3", True, marks=needs_interpreter),
        ("gemma2", False),
        pytest.param("gemma2", True, marks=needs_interpreter),
        pytest.param("gemma3", True, marks=needs_interpreter),
        pytest.param("phi3", True, marks=needs_interpreter),
        ("phi3-longrope", False),  # a 17-token prompt past LongRoPE's switch at 12, in chunks of 9 and 8
    ],
)
def test_chunked_prefill_with_cached_prefix(base_path, arch, triton):
    cfg, ours, hf = _load(base_path(arch), triton)
    check_chunked_prefill(ours, hf, cfg.vocab_size)


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=needs_interpreter)])
def test_sliding_window_matches_hf(base_path, triton):
    """Mistral with a 5-token window: prompts longer than the window, decode past it."""
    cfg, ours, hf = _load(base_path("mistral", sliding_window=5), triton)
    assert cfg.sliding_window == 5
    check_generation(ours, hf, cfg.vocab_size, [9, 4, 12], block_size=4)


@needs_interpreter
@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "phi3"])
def test_new_families_triton_path_matches_hf(base_path, arch):
    """Gemma 2's soft-capped, windowed layers, Gemma 3's local / global layers, Phi-3's window: the Triton
    kernels (interpreted) end to end, prompts past the window, decode past it."""
    cfg, ours, hf = _load(base_path(arch), triton=True)
    check_generation(ours, hf, cfg.vocab_size, [9, 4, 12], block_size=4)


def test_gemma2_soft_caps_matter(base_path):
    """The tiny Gemma 2's caps change its logits (so the parity tests above check them): without the attention
    cap, or without the final cap, the logits move far beyond the 1e-4 tolerance."""
    cfg, ours, hf = _load(base_path("gemma2"))
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.attn_scale) == (1.5, 2.0, 24**-0.5)
    ids = prompts([12], cfg.vocab_size)[0]
    ours.allocate_kv_cache(8, 4)
    capped = run_prefill(ours, Blocks(8, 4), {0: (ids, 0)})
    assert capped.abs().max() < 2.0
    for m in ours.modules():
        if isinstance(m, Attention):
            m.softcap = None
    assert (run_prefill(ours, Blocks(8, 4), {0: (ids, 0)}) - capped).abs().max() > 1e-2


@needs_interpreter
def test_triton_path_on_cpu_matches_hf(base_path):
    """The GPU code path (Triton k/v store, varlen prefill, paged decode) under TRITON_INTERPRET, end to end."""
    cfg, ours, hf = _load(base_path("qwen3"), triton=True)
    check_generation(ours, hf, cfg.vocab_size, [6, 11], block_size=8)


def test_kv_cache_sizes(base_path):
    cfg, ours, _ = _load(base_path("qwen3"))
    ours.allocate_kv_cache(10, 16)
    attn = ours.model.layers[0].self_attn.attn
    assert tuple(attn.k_cache.shape) == (10, 16, cfg.num_key_value_heads, cfg.head_dim)
    per_block = sum(l.self_attn.attn.k_cache[0].nbytes + l.self_attn.attn.v_cache[0].nbytes for l in ours.model.layers)
    assert ours.kv_bytes_per_block(16) == per_block
