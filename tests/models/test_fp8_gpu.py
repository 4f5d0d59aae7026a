"""FP8 bases on CUDA: the Triton small-M kernel (decode) and cuBLAS _scaled_mm (prefill) against transformers
fp32 quantizing the activations the same way (tests/models/test_fp8.py's reference); and the engine with CUDA
graphs through `multilora run`. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model
from tests.models.helpers import Blocks, check_generation, prompts, run_prefill
from tests.models.test_fp8 import fp8_dir, hf_reference  # noqa: F401 - fixture and reference shared

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", ["ct-channel-dynamic", "ct-tensor-static", "fbgemm", "ct-channel-weight-only"])
def test_fp32_on_cuda_matches_hf_quantizing_the_same_way(fp8_dir, kind):  # noqa: F811
    """fp32: the Triton kernel serves every M (cuBLAS rowwise FP8 wants a bf16 output)."""
    path = fp8_dir(kind)
    cfg = ModelConfig.from_dir(path)
    ours = load_model(path, cfg, dtype=torch.float32, device="cuda")
    hf = hf_reference(path.parent / "dequantized", ours.fp8, path)
    # an activation within float rounding of an e4m3 rounding boundary may round the other way under another
    # summation order, moving logits (about +-1.5) by ~1e-3: 1e-2, far below what a wrong scale or layout gives
    check_generation(ours, hf, cfg.vocab_size, [7, 13, 3], block_size=16, atol=1e-2)


@pytest.mark.parametrize("small_m", [0, 10_000])  # cuBLAS for every step / Triton for every step
@pytest.mark.parametrize("kind", ["ct-channel-dynamic", "ct-tensor-static"])
def test_bf16_on_cuda_close_to_hf(fp8_dir, kind, small_m):  # noqa: F811
    path = fp8_dir(kind)
    cfg = ModelConfig.from_dir(path)
    ours = load_model(path, cfg, dtype=torch.bfloat16, device="cuda", fp8_small_m=small_m)
    ids = prompts([40], cfg.vocab_size, seed=9)[0]
    ref = hf_reference(path.parent / "dequantized", ours.fp8, path)(torch.tensor([ids])).logits[0]
    ours.allocate_kv_cache(16, 16)
    got = run_prefill(ours, Blocks(16, 16), {0: (ids, 0)})
    assert ((got - ref).norm() / ref.norm()).item() < 0.05  # bf16 activations and output (measured ~0.01)


def test_run_quantization_fp8_on_cuda_with_graphs(tmp_path):
    """The engine end to end (CUDA graphs on, as default) on `--quantization fp8`: every line answered."""
    from tests.builders import build_mixed
    from tests.run.helpers import read_jsonl, run_cli, write_jsonl
    from tests.run.test_run_fp8 import LINES

    base, adapters = build_mixed(tmp_path / "src", "llama")
    inp, out = write_jsonl(tmp_path / "in.jsonl", LINES), tmp_path / "out.jsonl"
    flags = [x for name, path in adapters.items() for x in ("-a", f"{name}={path}")]
    rc, _, err = run_cli(
        ["run", str(inp), "-m", str(base), *flags, "-o", str(out), "--quantization", "fp8"]
        + ["--device", "cuda", "--dtype", "bfloat16", "--temperature", "0", "--max-tokens", "8", "-q"]
    )
    assert rc == 0, err
    records = read_jsonl(out)
    assert [r["id"] for r in records] == [line["id"] for line in LINES]
    assert all(r["usage"]["completion_tokens"] > 0 for r in records)
