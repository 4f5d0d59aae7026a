"""engine/slot_rows.py: every module's rank / scale rows in shared per-slice-count storage, one slot written at once."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from multilora_cli.engine.slot_rows import SlotRows
from multilora_cli.kernels.checks import check_weights
from multilora_cli.kernels.weights import LoraWeights


def _modules(max_loras: int = 5):
    # slice counts 3, 1, 2, 1 (qkv, o, gate_up, down): two share a group
    sizes = [(8, 4, 4), (8,), (6, 6), (8,)]
    return [
        ((0, f"m{j}"), SimpleNamespace(lora=LoraWeights.empty(max_loras, 4, 8, list(s), torch.float32, "cpu")))
        for j, s in enumerate(sizes)
    ]


def test_rows_stay_each_modules_contiguous_tensors_and_one_slot_is_written_alone():
    mods = _modules()
    for _, m in mods:
        m.lora.rank[1] = 7  # a value set before: kept
    rows = SlotRows(mods)
    assert [r.shape for _, r, _ in rows.groups] == [(2, 5, 1), (1, 5, 2), (1, 5, 3)]
    for _, m in mods:
        w = m.lora
        assert w.rank.is_contiguous() and w.scale.is_contiguous()
        assert tuple(w.rank.shape) == (5, w.n_slices) and w.rank.dtype == torch.int32
        assert (w.rank[1] == 7).all() and (w.rank[0] == 0).all()
        check_weights(w, torch.device("cpu"))  # what the kernels require of them
    width = 3
    ranks = np.array([[4, 2, 0], [3, 0, 0], [1, 4, 0], [2, 0, 0]], dtype=np.int32)[:, :width]
    scales = (ranks * 0.5).astype(np.float32)
    rows.write(3, rows.split(ranks, scales, torch.from_numpy))
    for j, (_, m) in enumerate(mods):
        k = m.lora.n_slices
        assert m.lora.rank[3].tolist() == ranks[j, :k].tolist()
        assert m.lora.scale[3].tolist() == scales[j, :k].tolist()
        assert (m.lora.rank[[0, 2, 4]] == 0).all() and (m.lora.rank[1] == 7).all()  # no other slot touched
    rows.clear(3)
    assert all((m.lora.rank[3] == 0).all() and (m.lora.scale[3] == 0).all() for _, m in mods)
    assert all((m.lora.rank[1] == 7).all() for _, m in mods)
