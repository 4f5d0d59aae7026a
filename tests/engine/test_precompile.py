"""engine/precompile.py: which prefill steps are dry-run, and that their inputs are valid step contexts."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.engine.cuda_graphs import graph_batch_sizes
from multilora_cli.engine.precompile import _prefill_inputs, precompile, prefill_sizes
from multilora_cli.kernels.blocks import expand_blocks, shrink_blocks, silu_blocks, token_bucket
from multilora_cli.kernels.sgmv_expand import partial_sum_args


def test_prefill_sizes_cover_every_bucket_up_to_the_step_budget():
    graphs = graph_batch_sizes(256)  # a large input: its decode graphs dry-run every step of 16 up to 256
    big = [256, 512, 1024, 2048, 4096, 8192]
    assert prefill_sizes(8192, graphs) == big
    assert prefill_sizes(5000, graphs) == big  # 5000 tokens use the 8192 bucket
    assert prefill_sizes(300, graphs) == [256, 512]
    assert prefill_sizes(100) == [8, 16, 32, 48, 64, 80, 96, 100]  # no graphs: a size per class below 100
    assert prefill_sizes(100, [1, 2, 4, 8, 14]) == [16, 32, 48, 64, 80, 96, 100]  # the demo's buckets
    assert prefill_sizes(5) == [5]
    for t in range(1, 9000, 37):  # every step size's table key is a dry-run size or exact (<= 256)
        assert t <= 256 or token_bucket(t) in prefill_sizes(9000)


# (in, out, slices) of LoRA modules: Llama-3-8B's qkv, o, gate_up, down; the demo's tiny model
SHAPES = [(4096, 6144, 3), (4096, 4096, 1), (4096, 28672, 2), (14336, 4096, 1), (128, 256, 3), (128, 512, 2)]


def _tables(t: int) -> tuple:
    """Everything the SGMV launches of a t-token step take from the tables (what makes a kernel variant)."""
    out = [silu_blocks(t), partial_sum_args(torch.empty(8, 1), t)["VEC"]]
    for i, o, n in SHAPES:
        out += [shrink_blocks(t, i, n, 16), expand_blocks(t, o, n, 16)]
    return tuple(out)


@pytest.mark.parametrize("limit, skip", [(256, ()), (256, (1, 2, 4, 8, 14)), (100, (1, 2, 3)), (41, ())])
def test_the_small_prefill_sizes_meet_every_step_size_s_blocks(limit, skip):
    """Below 256 tokens the tables key on the exact count: every count up to `limit` must get the blocks of a
    dry-run size (or of a decode bucket in `skip`), or its step would compile mid-run."""
    met = {_tables(t) for t in [*prefill_sizes(limit, skip), *skip]}
    missed = [t for t in range(1, limit + 1) if _tables(t) not in met]
    assert missed == []


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


def test_dry_sample_records_every_sampling_pass_of_an_unknown_input():
    """Lines not known (stdin): the sampler's launches on both paths, with and without a penalty's counts, then
    the logprob rows at k 0 and 5."""
    from multilora_cli.engine.dry_sample import dry_sample
    from multilora_cli.kernels.launch import _variant, collect

    with collect() as calls:
        dry_sample(torch.zeros(1, 1000, dtype=torch.bfloat16), None)
    sampling = [(kw["MODE"], kw["PROCESS"], kw["KC"] > 1) for _, _, kw in calls if "MODE" in kw]
    full, topk = [0] + [1] * 4 + [2] * 4 + [3, 4], [8, 9, 7, 5, 6]  # max, top-k, top-p levels, kept, draw; top-k path
    full32 = [0] + [1] * 8 + [2] * 8 + [3, 4]  # processed logits: fp32 keys, 8 levels
    # processed: every pass processes as it loads (PROCESS 1)
    assert sorted(sampling) == sorted(
        [(m, 0, False) for m in full]
        + [(m, 0, True) for m in topk]
        + [(m, 1, False) for m in full32]
        + [(m, 1, True) for m in topk]
    )
    assert [kw.get("KB") for _, _, kw in calls if "MODE" not in kw] == [None, 1, None, 8]  # logprob rows, k 0 / 5
    # one variant per mode and path: LEVEL and the row count are not specialised on
    assert len({_variant(c) for c in calls if "MODE" in c[2]}) == 2 * (5 + 5)
