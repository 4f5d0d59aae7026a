"""inspect / economics / bench show an FP8 base and count its bytes as FP8."""

from __future__ import annotations

import json

import pytest

from multilora_cli.economics.analysis import compute as run_scenario
from multilora_cli.economics.scenario import Scenario
from multilora_cli.economics.sources import resolve_model
from multilora_cli.models.quantization import base_bytes, projection_params
from tests.builders import build_adapter
from tests.models import fp8_checkpoints as ckpt
from tests.run.helpers import run_cli


def _figure(report, section: str, key: str):
    return report.section(section)[key]


def test_base_bytes_count_projections_at_one_byte():
    cfg = resolve_model("llama-3-70b").config
    bf16, fp8 = base_bytes(cfg, 2, False), base_bytes(cfg, 2, True)
    assert bf16 == 2 * cfg.num_params()
    proj = projection_params(cfg)
    channels = cfg.q_size + 2 * cfg.kv_size + 2 * cfg.hidden_size + 2 * cfg.intermediate_size  # out features a layer
    assert fp8 == bf16 - proj + 4 * cfg.num_hidden_layers * channels  # 1 B a projection weight, fp32 scale a row
    assert 70e9 < fp8 < 75e9 and 140e9 < bf16  # a 70B base: one H200 (141 GB) in FP8, two in bf16


def test_economics_fits_llama_70b_on_one_h200_in_fp8():
    bf16 = run_scenario(Scenario(tenants=64, model="llama-3-70b", gpu="h200"))
    fp8 = run_scenario(Scenario(tenants=64, model="llama-3-70b", gpu="h200", quantization="fp8"))
    assert _figure(bf16, "memory", "gpus_per_replica") == 2
    assert _figure(fp8, "memory", "gpus_per_replica") == 1
    assert _figure(fp8, "full_copy", "copy_bytes") == base_bytes(resolve_model("llama-3-70b").config, 2, True)


def test_inspect_and_economics_show_an_fp8_checkpoint(base_path, tmp_path):
    base = base_path("llama")
    fp8 = ckpt.fbgemm(base, tmp_path / "fp8")
    adapter = build_adapter(base, tmp_path / "adapter")
    rc, out, err = run_cli(["inspect", str(adapter), "--model", str(fp8), "--json"])
    rep = json.loads(out)
    assert rc == 0 and rep["servable"], err
    assert rep["base_quantization"] == (
        "fp8 e4m3 (fbgemm_fp8, per-channel weight scales, dynamic per-token <= 1200 activations)"
    )
    rc, out, err = run_cli(["inspect", str(adapter), "--model", str(fp8)])
    assert rc == 0 and b"base weights" in out and b"fbgemm_fp8" in out
    report = run_scenario(Scenario(tenants=4, model=str(fp8)))
    cfg = resolve_model(str(fp8)).config
    assert _figure(report, "full_copy", "copy_bytes") == base_bytes(cfg, 2, True) < base_bytes(cfg, 2, False)


@pytest.mark.slow
def test_bench_runs_both_quantizations_side_by_side(tmp_path):
    out = tmp_path / "bench.json"
    rc, _, err = run_cli(
        ["bench", "--preset", "tiny", "--device", "cpu", "--quantization", "none,fp8", "--requests", "8"]
        + ["--prompt-len", "8", "--output-len", "4", "--num-adapters", "2", "--json", str(out)]
    )
    assert rc == 0, err
    systems = [r["system"] for r in json.loads(out.read_text())["rows"]]
    assert systems == ["multilora", "multilora-base", "multilora-fp8", "multilora-base-fp8"]


def test_run_slot_sizing_counts_fp8_weights():
    """run's default slot count (engine/slot_budget.py) is sized beside the FP8 weights: a 70B base leaves room."""
    from multilora_cli.engine.slot_budget import weight_bytes

    cfg = resolve_model("llama-3-70b").config
    assert weight_bytes(cfg, 2, fp8=True) == weight_bytes(cfg, 2) - projection_params(cfg)
    assert weight_bytes(cfg, 2, fp8=True) < 0.9 * 141e9 < weight_bytes(cfg, 2)
