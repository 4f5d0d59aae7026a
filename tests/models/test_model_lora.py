"""LoRA parity: one mixed batch (three PEFT adapters + base rows) against PeftModel, prefill and decode."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.kernels import build_lora_meta
from multilora_cli.models.config import FUSED_MODULES, ModelConfig
from multilora_cli.models.loader import load_model
from tests.builders import build_adapter, load_peft
from tests.models.helpers import Blocks, check_mixed_lora_batch, prompts, run_prefill

ATOL = 1e-4
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # name: (slot, build_adapter kwargs)
    "qv8": (2, dict(r=8, alpha=16, targets=["q_proj", "v_proj"], seed=11)),
    "all4rs": (0, dict(r=4, alpha=8, targets=ALL, use_rslora=True, seed=12)),
    "mlp16": (
        3,
        dict(r=16, alpha=32, targets=["o_proj", "up_proj", "down_proj"], rank_pattern={"down_proj": 2}, seed=13),
    ),
}
# (adapter or None for base, prompt length): one packed batch, adapters interleaved with base rows
BATCH = [("qv8", 6), (None, 9), ("all4rs", 5), ("mlp16", 11), ("qv8", 4), ("all4rs", 8), (None, 3)]
DECODE_STEPS = 2


@pytest.fixture(scope="module")
def adapters(base_path, tmp_path_factory):
    made = {}

    def get(arch):
        if arch not in made:
            base = base_path(arch)
            root = tmp_path_factory.mktemp(f"adapters_{arch.replace('-', '_')}")
            made[arch] = {n: build_adapter(base, root / n, **kw) for n, (_, kw) in ADAPTERS.items()}
        return made[arch]

    return get


def _peft_reference(base: str, paths: dict) -> dict:
    """{adapter or None: (greedy continuation, logits of the whole sequence)} per batch row."""
    pm = load_peft(base, paths)  # HF fp32, eager attention, every adapter loaded

    def forward(seq, name):
        ids = torch.tensor([seq])
        if name is None:
            with pm.disable_adapter():
                return pm(input_ids=ids).logits[0]
        pm.set_adapter(name)
        return pm(input_ids=ids).logits[0]

    refs = []
    for (name, _), p in zip(BATCH, prompts([n for _, n in BATCH], pm.get_base_model().config.vocab_size, seed=5)):
        seq = list(p)
        for _ in range(DECODE_STEPS):
            seq.append(int(forward(seq, name)[-1].argmax()))
        refs.append((p, seq[len(p) :], forward(seq, name)))
    return refs


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_mixed_adapter_batch_matches_peft(base_path, adapters, arch):
    base = base_path(arch)
    paths = adapters(arch)
    cfg = ModelConfig.from_dir(base)
    model = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=4, max_lora_rank=16)
    mods = model.lora_modules()
    assert set(mods) == {(i, f) for i in range(cfg.num_hidden_layers) for f in FUSED_MODULES}
    for name, (slot, _) in ADAPTERS.items():
        ad = load_adapter(paths[name], name, cfg, dtype=torch.float32)
        for (layer, fused), mod in mods.items():
            mod.lora.set_slot(slot, ad.slices_for(layer, fused))
    refs = _peft_reference(str(base), paths)
    slot_of = lambda n: -1 if n is None else ADAPTERS[n][0]  # noqa: E731

    check_mixed_lora_batch(model, [n for n, _ in BATCH], refs, slot_of, atol=ATOL, steps=DECODE_STEPS)


def test_adapters_change_the_output(base_path, adapters):
    """Guard against a vacuous parity: each adapter moves its rows' logits well beyond the tolerance."""
    base = base_path("llama")
    cfg = ModelConfig.from_dir(base)
    model = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=4, max_lora_rank=16)
    for name, (slot, _) in ADAPTERS.items():
        ad = load_adapter(adapters("llama")[name], name, cfg)
        for (layer, fused), mod in model.lora_modules().items():
            mod.lora.set_slot(slot, ad.slices_for(layer, fused))
    ids = prompts([7], cfg.vocab_size)[0]
    outs = {}
    for name in [None, *ADAPTERS]:
        slot = -1 if name is None else ADAPTERS[name][0]
        outs[name] = run_prefill(model, Blocks(8, 4), {0: (ids, 0)}, lora=build_lora_meta([slot] * len(ids)))
    for name in ADAPTERS:
        assert (outs[name] - outs[None]).abs().max() > 100 * ATOL, name


def test_lora_targets_and_sizes(base_path):
    base = base_path("qwen3")
    cfg = ModelConfig.from_dir(base)
    model = load_model(
        base, cfg, dtype=torch.float32, max_loras=3, max_lora_rank=8, lora_targets={"qkv_proj", "down_proj"}
    )
    mods = model.lora_modules()
    assert {f for _, f in mods} == {"qkv_proj", "down_proj"}
    qkv = mods[(0, "qkv_proj")].lora
    assert qkv.slice_offsets == (0, cfg.q_size, cfg.q_size + cfg.kv_size, cfg.q_size + 2 * cfg.kv_size)
    assert tuple(qkv.a.shape) == (3, 3, 8, cfg.hidden_size)
    assert load_model(base, cfg, dtype=torch.float32).lora_modules() == {}
