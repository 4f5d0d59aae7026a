"""engine/logprobs.py's device op against its reference: torch.log_softmax of the fp32 logits, gathered at the
targets, argmax and top-k, for any chunking of the rows; and the packed rows as each sequence keeps them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from multilora_cli.engine.logprobs import StepLogprobs, entries, logprob_rows, unpack
from multilora_cli.engine.sequence import SeqStatus
from tests.devices import needs_interpreter


@pytest.mark.parametrize("chunk_rows", [1, 3, 64])
@pytest.mark.parametrize("k", [0, 1, 5])
def test_rows_equal_log_softmax_reference(chunk_rows, k):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 50, generator=g) * 4  # [R, V]
    targets = torch.randint(0, 50, (10,), generator=g)
    asked = []

    def chunk(lo, hi):
        asked.append(hi - lo)
        return x[lo:hi]

    out = logprob_rows(chunk, 10, 50, targets, k, chunk_elems=chunk_rows * 50)
    assert max(asked) <= chunk_rows and sum(asked) == 10  # never more rows' logits at once than the chunk
    ref = torch.log_softmax(x, dim=-1)
    assert out.shape == (10, 2 + 2 * k)
    torch.testing.assert_close(out[:, 0], ref.gather(1, targets[:, None])[:, 0])
    assert out[:, 1].long().tolist() == ref.argmax(-1).tolist()
    top = ref.topk(k, dim=-1) if k else None
    for r, (lp, am, pairs) in enumerate(unpack(list(out.numpy()))):
        assert am == int(ref[r].argmax()) and abs(lp - ref[r, targets[r]].item()) < 1e-5
        if k:
            assert [t for t, _ in pairs] == top.indices[r].tolist()
            np.testing.assert_allclose([v for _, v in pairs], top.values[r].numpy(), atol=1e-5)


def test_sampled_rows_subset_equals_all_rows():
    """The runner's sampled rows: a subset of rows (gathered first) gives those rows of the all-rows result."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 40, generator=g)
    chosen = torch.randint(0, 40, (6,), generator=g)
    every = logprob_rows(lambda lo, hi: logits[lo:hi], 6, 40, chosen, 3, chunk_elems=80)  # 2 rows a chunk
    rows = torch.tensor([1, 4])
    sub = logits[rows]
    some = logprob_rows(lambda lo, hi: sub[lo:hi], 2, 40, chosen[rows], 3)
    torch.testing.assert_close(some, every[rows])
    ref = torch.log_softmax(logits, -1).gather(1, chosen[:, None])[:, 0]
    torch.testing.assert_close(every[:, 0], ref)


def test_entries_equal_rows_one_by_one():
    """entries(): one TokenLogprob per (token, row) pair, cut at the shorter list (a stop token's row), each
    with the row's logprob and its top k as (id, text, logprob), texts from the table it is given."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 30, generator=g)
    out = logprob_rows(lambda lo, hi: x[lo:hi], 4, 30, torch.tensor([3, 1, 4, 1]), 2)
    rows = list(out.numpy())
    names = [f"t{i}" for i in range(30)]
    got = entries([3, 1, 4], rows, lambda ids: [names[i] for i in ids])
    assert len(got) == 3
    for e, row, tok in zip(got, rows, [3, 1, 4]):
        assert (e.id, e.token, e.logprob) == (tok, f"t{tok}", float(row[0]))
        assert e.top == [(int(row[j]), f"t{int(row[j])}", float(row[j + 1])) for j in (2, 4)]
    assert entries([], rows, lambda ids: []) == []
    zero = [r[:2] for r in rows]  # k 0: the chosen token's logprob only, each entry its own empty top list
    got = entries([3, 1], zero, lambda ids: [names[i] for i in ids])
    assert [(e.id, e.logprob, e.top) for e in got] == [(3, float(rows[0][0]), []), (1, float(rows[1][0]), [])]
    assert got[0].top is not got[1].top


def test_a_steps_rows_become_their_sequences_entries():
    """StepLogprobs.attach: the sampled rows (3 of a step's 4 sampled sequences, k 2, 1, 2) become one
    TokenLogprob each, with the step's id of its own sequence, its own k's top; a sequence that stopped at the
    step before (an ahead step's row) gets none."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 30, generator=g)
    ids = [7, 8, 9, 10]  # the step's sampled ids, one per sampled sequence
    rows = [0, 2, 3]
    packed = logprob_rows(lambda lo, hi: x[lo:hi], 3, 30, torch.tensor([ids[i] for i in rows]), 2)
    seqs = [SimpleNamespace(status=SeqStatus.RUNNING, logprobs=[]) for _ in rows]
    seqs[2].status = SeqStatus.FINISHED
    lp = StepLogprobs(sampled=packed, sampled_owners=seqs, sampled_ks=[2, 1, 2], sampled_rows=rows)
    names = [f"t{i}" for i in range(30)]
    lp.attach(ids, lambda ts: [names[t] for t in ts])
    want = entries([7, 9], [packed[0].numpy(), packed[1].numpy()], lambda ts: [names[t] for t in ts])
    del want[1].top[1:]
    assert seqs[0].logprobs == [want[0]] and seqs[1].logprobs == [want[1]] and seqs[2].logprobs == []
    assert len(want[0].top) == 2 and len(want[1].top) == 1 and want[1].token == "t9"


@needs_interpreter
def test_triton_path_equals_torch_path(monkeypatch):
    """The dispatch: with Triton forced (the CUDA path, here under the interpreter) logprob_rows gives the torch
    path's rows, chunk by chunk: the same ids, logprobs within 1e-5."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 300, generator=g) * 3
    targets = torch.randint(0, 300, (7,), generator=g)
    got = {}
    for path in ("triton", "torch"):
        monkeypatch.setenv("MULTILORA_KERNELS", path)
        got[path] = logprob_rows(lambda lo, hi: x[lo:hi], 7, 300, targets, 5, chunk_elems=3 * 300)
    assert torch.equal(got["triton"][:, 1], got["torch"][:, 1])
    assert torch.equal(got["triton"][:, 2::2], got["torch"][:, 2::2])
    torch.testing.assert_close(got["triton"], got["torch"], atol=1e-5, rtol=1e-6)
