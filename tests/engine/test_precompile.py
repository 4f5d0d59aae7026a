"""engine/precompile.py: which prefill steps are dry-run, and that their inputs are valid step contexts."""

from __future__ import annotations

import torch

from multilora_cli.engine.precompile import _prefill_inputs, precompile, prefill_sizes
from multilora_cli.kernels.blocks import token_bucket


def test_prefill_sizes_cover_every_bucket_up_to_the_step_budget():
    assert prefill_sizes(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert prefill_sizes(5000) == [256, 512, 1024, 2048, 4096, 8192]  # 5000 tokens use the 8192 bucket
    assert prefill_sizes(300) == [256, 512]
    assert prefill_sizes(100) == [100]
    for t in range(1, 9000, 37):  # every step size's table key is a dry-run size or exact (<= 256)
        assert t <= 256 or token_bucket(t) in prefill_sizes(9000)


def test_prefill_inputs_are_a_consistent_context():
    ids, pos, ctx = _prefill_inputs(1000, 384, 16, 16, torch.device("cpu"), None)
    assert ids.shape == pos.shape == (1000,)
    assert ctx.seqlens_q == [384, 384, 232] and ctx.seqlens_k == [400, 400, 248]
    assert ctx.cu_seqlens_q.tolist() == [0, 384, 768, 1000]
    assert ctx.cu_seqlens_k.tolist() == [0, 400, 800, 1048]
    assert pos[:2].tolist() == [16, 17] and pos[384].item() == 16  # positions continue after the prefix
    assert ctx.block_tables.shape == (3, 25) and ctx.max_seqlen_q == 384
    assert (ctx.slot_mapping == -1).all(), "a dry step stores nothing"
    _, _, flat = _prefill_inputs(256, 256, 0, 16, torch.device("cpu"), None)
    assert flat.block_tables is None and flat.seqlens_q == flat.seqlens_k == [256]


def test_precompile_is_cuda_only():
    assert precompile(
        None, None, None, max_num_batched_tokens=512, max_model_len=256, block_size=16, device=torch.device("cpu")
    ) == (0, 0.0)


def test_dry_sample_records_every_sampling_pass():
    """The sampler's launches are recorded with top-k and top-p on, so their variants compile before the run."""
    from multilora_cli.engine.precompile import _dry_sample
    from multilora_cli.kernels.launch import _variant, collect

    with collect() as calls:
        _dry_sample(torch.zeros(1, 1000, dtype=torch.bfloat16))
    modes = [(kw["MODE"], kw["PROCESS"]) for _, _, kw in calls]
    full, topk = [0] + [1] * 4 + [2] * 4 + [3, 4], [1] * 4 + [5, 6]  # max, top-k, top-p levels, kept, draw
    full32 = [0] + [1] * 8 + [2] * 8 + [3, 4]  # processed logits: fp32 keys, 8 levels
    assert modes == [(m, False) for m in full + topk] + [(m, True) for m in full32 + topk]
    if hasattr(calls[0][0], "params"):  # a compiled JITFunction (the interpreter's wrapper has no parameter kinds)
        # one variant per mode and path: LEVEL is not specialised on (the top-k path's count levels: its own KC)
        assert len({_variant(c) for c in calls}) == 2 * (5 + 3)
