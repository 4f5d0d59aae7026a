"""DoRA slot loads (engine/dora.py DoraNorms through SlotWriter): the batched norms equal PEFT's formula per slice,
packed and unpacked loads agree, a slot that held a higher-rank adapter (stale rows past the new rank) or was
evicted gets the same rows on reload, the packed buffer carries the magnitudes, and a load's op count does not
grow per slice and holds no host read-back."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from multilora_cli.adapters.peft import SLICES, load_adapter
from multilora_cli.engine.dora import slice_scale
from multilora_cli.engine.packed import magnitude_region, pack_adapter
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model
from tests.builders import build_adapter, build_base

KINDS = {
    "dora_all": dict(r=4, alpha=8, targets="all-linear", use_dora=True, seed=41),
    "dora_some": dict(r=8, alpha=32, targets=["q_proj", "v_proj", "up_proj"], use_dora=True, use_rslora=True, seed=42),
    "plain": dict(r=8, alpha=16, targets="all-linear", seed=43),
}


def _setup(tmp_path, layers: int = 2):
    base = build_base(tmp_path / "base", "llama", num_hidden_layers=layers)
    cfg = ModelConfig.from_dir(base)
    adapters = {n: load_adapter(build_adapter(base, tmp_path / n, **kw), n, cfg) for n, kw in KINDS.items()}
    model = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=3, max_lora_rank=8)
    writer = SlotWriter(model.lora_modules(), torch.device("cpu"))
    writer.enable_dora()
    return model, writer, adapters


def _rows(model, slot: int) -> torch.Tensor:
    return torch.cat([m.lora.dora[slot] for m in model.lora_modules().values()])


def _reference(model, adapter) -> torch.Tensor:
    """PEFT's g per slice, one slice at a time from the adapter's own tensors (1 where no magnitude)."""
    rows = []
    for (layer, fused), module in model.lora_modules().items():
        w = module.lora
        row = torch.ones(w.out_features)
        for i, name in enumerate(SLICES[fused]):
            m = adapter.magnitudes.get((layer, name))
            if m is not None:
                lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
                spec = adapter.modules[(layer, name)]
                row[lo:hi] = slice_scale(module.weight[lo:hi], spec.a, spec.b, spec.scaling, m)
        rows.append(row)
    return torch.cat(rows)


def test_batched_norms_are_peft_per_slice_packed_or_not_and_after_stale_slots(tmp_path):
    model, writer, ad = _setup(tmp_path)
    want = {n: _reference(model, ad[n]) for n in ("dora_all", "dora_some")}
    assert ((want["dora_all"] - 1).abs() > 1e-2).float().mean() > 0.9  # not vacuous: features rescaled
    writer.install(0, ad["plain"])  # rank 8 everywhere: stale rows past dora_all's rank 4 stay in the slot
    assert torch.equal(_rows(model, 0), torch.ones_like(_rows(model, 0)))
    writer.install(0, ad["dora_all"])
    torch.testing.assert_close(_rows(model, 0), want["dora_all"], atol=1e-6, rtol=1e-5)
    writer.install(1, pack_adapter(ad["dora_some"], pin=False))  # packed: magnitudes from the buffer
    torch.testing.assert_close(_rows(model, 1), want["dora_some"], atol=1e-6, rtol=1e-5)
    first = _rows(model, 1).clone()
    writer.clear(1)  # evicted: plain again, then reloaded (packed) over a slot that held another adapter
    assert torch.equal(_rows(model, 1), torch.ones_like(first))
    writer.install(1, pack_adapter(ad["plain"], pin=False))
    writer.install(1, pack_adapter(ad["dora_some"], pin=False))
    assert torch.equal(_rows(model, 1), first)
    writer.install(2, ad["dora_some"])  # unpacked into another slot: the same rows
    torch.testing.assert_close(_rows(model, 2), first, atol=1e-6, rtol=1e-6)
    assert torch.equal(_rows(model, 0), _rows(model, 0))  # other slots untouched by the loads above
    torch.testing.assert_close(_rows(model, 0), want["dora_all"], atol=1e-6, rtol=1e-5)
    base_row = model.lora_modules()[(0, "qkv_proj")].lora.dora[-1]
    assert torch.equal(base_row, torch.ones_like(base_row))


def test_packed_buffer_carries_the_magnitudes(tmp_path):
    _, _, ad = _setup(tmp_path)
    p = pack_adapter(ad["dora_some"], pin=False)
    region = magnitude_region(p.flat, p.plan)
    lo, hi = region.data_ptr(), region.data_ptr() + region.numel() * 4
    for key, m in ad["dora_some"].magnitudes.items():
        view = p.magnitudes[key]
        assert torch.equal(view, m) and lo <= view.data_ptr() < hi  # a view of the one buffer, not a copy
    assert set(p.magnitudes) == set(ad["dora_some"].magnitudes)
    plain = pack_adapter(ad["plain"], pin=False)
    assert plain.plan.mags == () and plain.flat.numel() == plain.plan.ab_total  # plain LoRA: nothing added


class _Ops(TorchDispatchMode):
    """Counts the aten ops that compute (views left out) and the host read-backs (.item(), .tolist(), bool())."""

    VIEWS = {"view", "_unsafe_view", "select", "slice", "t", "transpose", "expand", "alias", "as_strided", "unsqueeze"}

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.readbacks = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.removeprefix("aten::")
        if name in ("_local_scalar_dense", "is_nonzero", "item"):
            self.readbacks += 1
        elif name not in self.VIEWS:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _load_ops(tmp_path, layers: int, name: str = "dora_all") -> _Ops:
    _, writer, ad = _setup(tmp_path, layers)
    p = pack_adapter(ad[name], pin=False)
    writer.install(0, p)  # warm: cached views and gather index
    with _Ops() as ops:
        writer.install(0, p)
    return ops


def test_a_dora_load_is_batched_and_never_reads_back(tmp_path):
    """Going from 2 to 4 layers adds 8 modules / 14 slices; the load gains a few ops per module (its W Aᵀ GEMM),
    not the ~15 per slice of a per-slice computation, and never reads a device value back to the host."""
    two, four = _load_ops(tmp_path / "two", 2), _load_ops(tmp_path / "four", 4)
    assert two.readbacks == 0 and four.readbacks == 0
    assert four.ops - two.ops <= 5 * 8, (two.ops, four.ops)  # measured 4 per module (a per-slice path: ~200)
    plain = _load_ops(tmp_path / "plain", 4, "plain")  # a plain load: the copies and the rank / scaling rows
    assert plain.readbacks == 0 and plain.ops <= 8, plain.ops
