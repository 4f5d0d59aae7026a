"""FP8 bases on the CPU reference path, against transformers fp32 on the dequantized weights.

Checkpoints are written by tests/models/fp8_checkpoints.py as compressed-tensors and fbgemm_fp8 lay them out.
Weight-only FP8 (activations unquantized) matches HF on the dequantized weights to 1e-4. With quantized activations
it matches HF whose decoder Linear inputs are quantized the same way (per-token absmax / 448 or the static
input_scale, rounded to e4m3: kernels/fp8.quantize_activations, applied by a forward pre-hook) to 1e-4, and stays
within BOUND of the unquantized-activation reference (stated below, measured on these tiny models)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import fp8 as fp8_kernels
from multilora_cli.kernels.fp8 import Fp8Scheme
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.models.config import FUSED, ModelConfig
from multilora_cli.models.loader import load_model
from multilora_cli.models.quantization import ONLINE
from tests.models import fp8_checkpoints as ckpt
from tests.models.helpers import Blocks, check_generation, prompts, run_prefill

# relative error ||logits - reference|| / ||reference|| of FP8 activations vs unquantized ones on these tiny random
# models (two layers, widened weights: a harsh case): measured 0.056 (per-token dynamic), 0.082 (static per tensor)
BOUND = 0.1
KINDS = {  # name: (writer, kwargs, activation scheme)
    "ct-channel-dynamic": (ckpt.compressed_tensors, dict(weights="channel", activations="dynamic"), "dynamic"),
    "ct-tensor-static": (ckpt.compressed_tensors, dict(weights="tensor", activations="static"), "static"),
    "ct-channel-weight-only": (ckpt.compressed_tensors, dict(weights="channel", activations="none"), "none"),
    "ct-tensor-weight-only": (ckpt.compressed_tensors, dict(weights="tensor", activations="none"), "none"),
    "fbgemm": (ckpt.fbgemm, dict(), "dynamic"),
}


@pytest.fixture(scope="module")
def fp8_dir(base_path, tmp_path_factory):
    made = {}

    def get(kind: str, arch: str = "llama"):
        if (kind, arch) not in made:
            writer, kw, _ = KINDS[kind]
            root = tmp_path_factory.mktemp(f"{kind}-{arch}")
            made[kind, arch] = writer(base_path(arch), root / "fp8", **kw)
            ckpt.dequantized(made[kind, arch], root / "dequantized")
        return made[kind, arch]

    return get


def hf_reference(path, scheme: Fp8Scheme | None = None, fp8_path=None):
    """transformers fp32 on `path`; with `scheme`, each decoder Linear's input quantized as our FP8 layers do
    (static scales read from `fp8_path`)."""
    import transformers as tf
    from safetensors.torch import load_file

    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if scheme is None or scheme.activations == "none":
        return hf
    scales = load_file(fp8_path / "model.safetensors") if scheme.activations == "static" else {}
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.startswith("model.layers."):
            # our fused module quantizes q, k, v's (gate, up's) shared input with the largest of their input scales
            parent, leaf = name.rsplit(".", 1)
            group = next((g for g in ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}) if leaf in g), {leaf})
            names = [f"{parent}.{g}.input_scale" for g in sorted(group) if f"{parent}.{g}.input_scale" in scales]
            s_in = torch.stack([scales[n].reshape(()) for n in names]) if names else None

            def hook(m, args, s_in=s_in):
                x = args[0]
                xq, s = fp8_kernels.quantize_activations(x.reshape(-1, x.shape[-1]), scheme, s_in)
                return ((xq.float() * s).reshape(x.shape),)

            mod.register_forward_pre_hook(hook)
    return hf


def _load(path, **kw):
    cfg = ModelConfig.from_dir(path)
    return cfg, load_model(path, cfg, dtype=torch.float32, device="cpu", **kw)


@pytest.mark.parametrize("kind", list(KINDS))
def test_dequantized_weights_equal_the_source_to_fp8_rounding(base_path, fp8_dir, kind):
    from safetensors.torch import load_file

    cfg, model = _load(fp8_dir(kind))
    source = load_file(base_path("llama") / "model.safetensors")
    deq = ckpt.dequantized_tensors(fp8_dir(kind))
    n = 0
    for name, w in source.items():
        if not ckpt._is_proj(name):
            continue
        prefix, hf_mod, _ = name.rsplit(".", 2)
        fused, idx = FUSED[hf_mod]
        mod = model.get_submodule(f"{prefix}.{fused}")
        assert isinstance(mod, FusedLinear) and mod.weight.dtype == torch.float8_e4m3fn
        ours = mod.slice_view(mod.dequantized_weight(), idx)
        assert torch.equal(ours, deq[name]), name  # exactly the checkpoint's numbers
        # e4m3: 3 mantissa bits -> relative error <= 2^-4 for normals; subnormals (below 2^-6 * scale) in steps of
        # 2^-9 * scale
        scale = w.abs().amax(dim=1 if "tensor" not in kind else None, keepdim=True) / 448
        assert ((ours - w).abs() <= torch.maximum(w.abs() * 2**-4, scale * 2**-9) + 1e-12).all(), name
        n += 1
    assert n == 7 * cfg.num_hidden_layers
    # embeddings, norms and lm_head stay unquantized
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == torch.float32


@pytest.mark.parametrize("kind", ["ct-channel-weight-only", "ct-tensor-weight-only"])
def test_weight_only_matches_hf_on_dequantized_weights(fp8_dir, kind):
    cfg, ours = _load(fp8_dir(kind))
    assert ours.fp8.activations == "none"
    hf = hf_reference(fp8_dir(kind).parent / "dequantized")
    check_generation(ours, hf, cfg.vocab_size, [7, 13, 3], block_size=4)


@pytest.mark.parametrize("kind", ["ct-channel-dynamic", "ct-tensor-static", "fbgemm"])
def test_quantized_activations_match_hf_quantizing_the_same_way(fp8_dir, kind):
    path = fp8_dir(kind)
    cfg, ours = _load(path)
    scheme = ours.fp8
    assert scheme.activations == KINDS[kind][2] and (scheme.scale_ub == 1200.0) == (kind == "fbgemm")
    check_generation(ours, hf_reference(path.parent / "dequantized", scheme, path), cfg.vocab_size, [7, 13, 3], 4)


@pytest.mark.parametrize("kind", ["ct-channel-dynamic", "ct-tensor-static"])
def test_quantized_activations_stay_within_bound_of_unquantized(fp8_dir, kind):
    path = fp8_dir(kind)
    cfg, ours = _load(path)
    hf = hf_reference(path.parent / "dequantized")
    ids = prompts([11], cfg.vocab_size, seed=2)[0]
    ours.allocate_kv_cache(16, 4)
    got = run_prefill(ours, Blocks(16, 4), {0: (ids, 0)})
    ref = hf(torch.tensor([ids])).logits[0]
    rel = ((got - ref).norm() / ref.norm()).item()
    assert 1e-5 < rel < BOUND, rel  # activations were quantized (not a no-op), and not far off


def test_online_quantization_equals_a_per_channel_dynamic_checkpoint(base_path, fp8_dir):
    """--quantization fp8 on the fp32 base == llm-compressor's FP8-dynamic checkpoint of it, weights and logits."""
    base = base_path("llama")
    cfg = ModelConfig.from_dir(base)
    online = load_model(base, cfg, dtype=torch.float32, quantization=ONLINE)
    _, stored = _load(fp8_dir("ct-channel-dynamic"))
    for (n, a), (m, b) in zip(online.named_parameters(), stored.named_parameters()):
        assert n == m and a.dtype == b.dtype and torch.equal(a.float(), b.float()), n
    assert ModelConfig.from_dir(base).quantization is None  # the checkpoint itself is untouched


def test_phi3_fused_checkpoint(fp8_dir):
    """Phi-3 stores qkv_proj / gate_up_proj fused: one scale vector (or number) for the whole fused tensor."""
    kind = "ct-tensor-static"
    path = fp8_dir(kind, "phi3")
    cfg, ours = _load(path)
    check_generation(ours, hf_reference(path.parent / "dequantized", ours.fp8, path), cfg.vocab_size, [7, 9], 4)


def test_dummy_weights_are_fp8(base_path):
    cfg = ModelConfig.from_dir(base_path("llama"))
    model = load_model(base_path("llama"), cfg, dtype=torch.float32, load_format="dummy", quantization=ONLINE)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and (qkv.weight_scale > 0).all()
    assert 0.015 < qkv.dequantized_weight().std().item() < 0.025  # N(0, 0.02^2), quantized
