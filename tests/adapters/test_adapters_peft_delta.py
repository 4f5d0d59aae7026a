"""Our A / B / scaling reproduce PEFT's own weight delta for every module of real PEFT-written adapters.

Reference: `PeftModel.from_pretrained(base, adapter).merge_and_unload()` minus the base weights. Modules we
do not load must be left untouched by PEFT too, so nothing is silently dropped.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.adapters.peft import SLICES, load_adapter
from multilora_cli.kernels.weights import LoraWeights
from multilora_cli.models.config import FUSED_MODULES, LINEAR_MODULES, ModelConfig

PARENT = {m: ("self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp") for m in LINEAR_MODULES}
ALL = list(LINEAR_MODULES)

# name -> (arch, build_adapter kwargs, check on the loaded adapter)
VARIANTS = {
    "llama-rslora-all-linear": ("llama", dict(r=8, alpha=16, targets="all-linear", use_rslora=True), None),
    "llama-rank-alpha-pattern": (
        "llama",
        dict(
            r=4,
            alpha=8,
            targets=ALL,
            rank_pattern={"q_proj": 8, "model.layers.1.mlp.down_proj": 2},
            alpha_pattern={"v_proj": 32, "layers.0.self_attn.o_proj": 4},
        ),
        "patterned",
    ),
    "llama-regex-bin": (
        "llama",
        dict(r=6, alpha=12, safetensors=False, targets=r".*\.layers\.1\.(self_attn\.(q|k)_proj|mlp\.up_proj)"),
        "regex",
    ),
    "llama-layers-to-transform": (
        "llama",
        dict(
            r=4, alpha=4, targets=["q_proj", "gate_proj", "down_proj"], layers_to_transform=[1], layers_pattern="layers"
        ),
        "layer1",
    ),
    "qwen2-all-linear-patterns-rslora": (
        "qwen2",
        dict(
            r=8,
            alpha=16,
            targets="all-linear",
            use_rslora=True,
            rank_pattern={"k_proj": 2},
            alpha_pattern={"gate_proj": 3},
        ),
        "patterned",
    ),
    "qwen2-regex-bin": (
        "qwen2",
        dict(r=4, alpha=32, targets=r".*\.(q_proj|v_proj|down_proj)", safetensors=False),
        None,
    ),
    "qwen2-layers-int": ("qwen2", dict(r=2, alpha=2, targets=["o_proj", "up_proj"], layers_to_transform=0), "layer0"),
}


@pytest.fixture(scope="module")
def built(zoo):
    """Build every variant once: (adapter path, base path)."""
    out = {}
    for name, (arch, kw, _) in VARIANTS.items():
        base = zoo.base(arch, arch)
        out[name] = (zoo.adapter(name, base, **kw), base)
    return out


def _peft_delta_and_layers(base_path, adapter_path):
    """PEFT's merged-minus-base delta per linear weight, and PEFT's own (r, scaling) per LoRA layer."""
    import transformers as tf
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    model = tf.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pm = PeftModel.from_pretrained(model, adapter_path)
    peft_layers = {
        name.removeprefix("base_model.model."): (mod.r["default"], mod.scaling["default"])
        for name, mod in pm.named_modules()
        if isinstance(mod, LoraLayer)
    }
    merged = pm.merge_and_unload().state_dict()
    return {k: merged[k] - before[k] for k in before}, peft_layers


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_delta_matches_peft_merge(built, variant):
    adapter_path, base_path = built[variant]
    mc = ModelConfig.from_dir(base_path)
    ours = load_adapter(adapter_path, variant, mc)
    deltas, peft_layers = _peft_delta_and_layers(base_path, adapter_path)

    assert {ours.module_names[k] for k in ours.modules} == set(peft_layers)
    for (layer, module), m in ours.modules.items():
        r, scaling = peft_layers[ours.module_names[(layer, module)]]
        assert m.rank == r and m.scaling == pytest.approx(scaling, rel=1e-12)
    checked = 0
    for layer in range(mc.num_hidden_layers):
        for module in LINEAR_MODULES:
            delta = deltas[f"model.layers.{layer}.{PARENT[module]}.{module}.weight"]  # [out, in]
            m = ours.modules.get((layer, module))
            if m is None:
                assert torch.count_nonzero(delta) == 0, (layer, module)
                continue
            torch.testing.assert_close(m.scaling * (m.b @ m.a), delta, atol=2e-6, rtol=1e-4)
            assert torch.count_nonzero(delta) > 0
            checked += 1
    assert checked == len(ours.modules) > 0

    check = VARIANTS[variant][2]
    if check == "patterned":
        assert ours.min_rank < ours.max_rank
        assert len({m.scaling for m in ours.modules.values()}) > 1
    elif check == "layer1":
        assert ours.layers == [1]
    elif check == "layer0":
        assert ours.layers == [0]
    elif check == "regex":
        assert sorted(ours.modules) == [(1, "k_proj"), (1, "q_proj"), (1, "up_proj")]


def test_counts_bytes_and_dtype(built):
    adapter_path, base_path = built["llama-rank-alpha-pattern"]
    ours = load_adapter(adapter_path, "x")
    mc = ModelConfig.from_dir(base_path)
    want = sum(ours.config.rank_for(ours.module_names[k]) * sum(mc.linear_shape(k[1])) for k in ours.modules)
    assert ours.num_params == want
    assert ours.nbytes == 4 * want and ours.dtype == torch.float32
    half = load_adapter(adapter_path, "x", dtype=torch.bfloat16)
    assert all(m.a.dtype == torch.bfloat16 and m.b.dtype == torch.bfloat16 for m in half.modules.values())
    assert half.dtype == torch.float32 and half.nbytes == ours.nbytes  # "as stored" stays as stored


def test_slices_fit_lora_weights_layout(built):
    """slices_for gives exactly what LoraWeights.set_slot takes, for every fused module and layer."""
    adapter_path, base_path = built["llama-rank-alpha-pattern"]
    mc = ModelConfig.from_dir(base_path)
    ours = load_adapter(adapter_path, "x", mc)
    for fused in FUSED_MODULES:
        names = SLICES[fused]
        in_f = mc.linear_shape(names[0])[0]
        w = LoraWeights.empty(2, ours.max_rank, in_f, [mc.linear_shape(n)[1] for n in names], torch.float32, "cpu")
        for layer in range(mc.num_hidden_layers):
            slices = ours.slices_for(layer, fused)
            assert len(slices) == len(names)
            w.set_slot(1, slices)
            for i, n in enumerate(names):
                m = ours.modules[(layer, n)]
                assert int(w.rank[1, i]) == m.rank and float(w.scale[1, i]) == pytest.approx(m.scaling)


def test_partial_targets_leave_none_slices(built):
    adapter_path, _ = built["llama-layers-to-transform"]
    ours = load_adapter(adapter_path, "x")
    assert ours.slices_for(0, "qkv_proj") == [None, None, None]
    q, k, v = ours.slices_for(1, "qkv_proj")
    assert q is not None and k is None and v is None
    gate, up = ours.slices_for(1, "gate_up_proj")
    assert gate is not None and up is None
