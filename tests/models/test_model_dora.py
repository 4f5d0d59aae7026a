"""DoRA parity at the model level: one mixed batch (base rows, a plain LoRA, two DoRA adapters, one on every
packed slice and one on some) against PeftModel, prefill and decode, logits to 1e-4 (fp32, CPU). Qwen2 has q/k/v
biases (DoRA scales W·x, not the bias); Phi-3's PEFT adapters sit on its fused qkv_proj / gate_up_proj, whose
magnitude vectors split with lora_B's rows."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.engine.dora import slice_scale
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.kernels import build_lora_meta
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model
from tests.builders import build_adapter, load_peft
from tests.models.helpers import Blocks, check_mixed_lora_batch, prompts, run_prefill

ATOL = 1e-4


def _adapters(arch: str) -> dict[str, tuple[int, dict]]:
    """name: (slot, build_adapter kwargs)."""
    phi = arch.startswith("phi3")
    return {
        "plain": (1, dict(r=8, alpha=16, targets=["o_proj", "down_proj"], seed=21)),
        "dora_all": (0, dict(r=4, alpha=8, targets="all-linear", use_dora=True, seed=22)),
        "dora_some": (
            3,
            dict(
                r=8,
                alpha=32,
                targets=["qkv_proj", "down_proj"] if phi else ["q_proj", "v_proj", "up_proj"],
                use_dora=True,
                use_rslora=True,
                seed=23,
            ),
        ),
    }


BATCH = [("dora_all", 6), (None, 5), ("plain", 7), ("dora_some", 4), ("dora_all", 3), (None, 8), ("dora_some", 9)]
DECODE_STEPS = 2


def _peft_refs(base, paths: dict, vocab: int) -> list:
    """Per batch row: (prompt, greedy continuation, logits of the whole sequence)."""
    pm = load_peft(base, paths)  # HF fp32, eager attention, every adapter loaded

    def forward(seq, name):
        ids = torch.tensor([seq])
        if name is None:
            with pm.disable_adapter():
                return pm(input_ids=ids).logits[0]
        pm.set_adapter(name)
        return pm(input_ids=ids).logits[0]

    refs = []
    for (name, _), p in zip(BATCH, prompts([n for _, n in BATCH], vocab, seed=7)):
        seq = list(p)
        for _ in range(DECODE_STEPS):
            seq.append(int(forward(seq, name)[-1].argmax()))
        refs.append((p, seq[len(p) :], forward(seq, name)))
    return refs


@pytest.mark.parametrize(
    "arch,kernels", [("llama", "torch"), ("qwen2", "torch"), ("phi3", "torch"), ("qwen2", "triton")]
)
def test_dora_mixed_batch_matches_peft(base_path, tmp_path, monkeypatch, arch, kernels):
    """kernels="triton": the CUDA path's kernels (SGMV, the one-pass DoRA scaling) under the interpreter."""
    monkeypatch.setenv("MULTILORA_KERNELS", kernels)
    base = base_path(arch)
    specs = _adapters(arch)
    paths = {n: build_adapter(base, tmp_path / n, **kw) for n, (_, kw) in specs.items()}
    cfg = ModelConfig.from_dir(base)
    model = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=4, max_lora_rank=8)
    writer = SlotWriter(model.lora_modules(), torch.device("cpu"))
    writer.enable_dora()
    for name, (slot, _) in specs.items():
        writer.install(slot, load_adapter(paths[name], name, cfg, dtype=torch.float32))
    refs = _peft_refs(str(base), paths, cfg.vocab_size)
    slot_of = lambda n: -1 if n is None else specs[n][0]  # noqa: E731

    check_mixed_lora_batch(model, [n for n, _ in BATCH], refs, slot_of, atol=ATOL, steps=DECODE_STEPS)


def test_dora_scale_matters_and_plain_slots_stay_one(base_path, tmp_path):
    """Guard against a vacuous parity: the DoRA scales are far from 1 where adapted, exactly 1 elsewhere (plain
    LoRA slot, unadapted slices, the base row); and dropping them moves the logits well past the tolerance."""
    base = base_path("llama")
    specs = _adapters("llama")
    cfg = ModelConfig.from_dir(base)
    model = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=4, max_lora_rank=8)
    writer = SlotWriter(model.lora_modules(), torch.device("cpu"))
    writer.enable_dora()
    for name, (slot, kw) in specs.items():
        writer.install(slot, load_adapter(build_adapter(base, tmp_path / name, **kw), name, cfg))
    qkv = model.lora_modules()[(0, "qkv_proj")].lora
    assert (qkv.dora[0] - 1).abs().min() > 1e-3  # dora_all: every q / k / v feature rescaled
    assert torch.equal(qkv.dora[1], torch.ones_like(qkv.dora[1]))  # plain LoRA slot
    assert torch.equal(qkv.dora[-1], torch.ones_like(qkv.dora[-1]))  # base row
    k = slice(*qkv.slice_offsets[1:3])
    assert torch.equal(qkv.dora[3, k], torch.ones_like(qkv.dora[3, k]))  # dora_some has no k_proj
    ids = prompts([7], cfg.vocab_size)[0]
    with_g = run_prefill(model, Blocks(8, 4), {0: (ids, 0)}, lora=build_lora_meta([0] * len(ids)))
    for m in model.lora_modules().values():
        m.lora.dora.fill_(1.0)
    without = run_prefill(model, Blocks(8, 4), {0: (ids, 0)}, lora=build_lora_meta([0] * len(ids)))
    assert (with_g - without).abs().max() > 100 * ATOL


def test_slice_scale_is_peft_norm():
    """slice_scale (expanded, W read in row chunks) = m / ||W + s·B·A|| row by row, as PEFT's get_weight_norm
    computes it."""
    import peft.tuners.lora.dora as dora

    g = torch.Generator().manual_seed(0)
    w, a, b = (torch.randn(*s, generator=g) for s in ((37, 11), (3, 11), (37, 3)))
    w0 = w.clone()
    m = torch.rand(37, generator=g) + 0.5
    want = m / dora.DoraLinearLayer(fan_in_fan_out=False).get_weight_norm(w, b @ a, scaling=0.7)
    import multilora_cli.engine.dora as ours

    old, ours._CHUNK_ELEMS = ours._CHUNK_ELEMS, 11 * 5  # 5 rows per chunk: exercise the chunking
    try:
        torch.testing.assert_close(slice_scale(w, a, b, 0.7, m), want, atol=1e-6, rtol=1e-6)
        assert torch.equal(w, w0)  # the base weight is read, never written
        # a bf16 base and slot (the GPU's case): the same norms of the bf16 values, to float32 rounding
        wb, ab, bb = (t.bfloat16() for t in (w, a, b))
        want_b = m / dora.DoraLinearLayer(fan_in_fan_out=False).get_weight_norm(
            wb.float(), bb.float() @ ab.float(), scaling=0.7
        )
        torch.testing.assert_close(slice_scale(wb, ab, bb, 0.7, m), want_b, atol=1e-5, rtol=1e-5)
    finally:
        ours._CHUNK_ELEMS = old
