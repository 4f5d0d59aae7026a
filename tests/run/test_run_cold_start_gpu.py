"""A run with a warm Triton cache compiles nothing (GPU only): two fresh `multilora run` processes share one new
TRITON_CACHE_DIR; the first compiles its kernels, the second only loads them, before and inside its steps
(the stats' "startup" section: engine/startup.py, kernels/compile_log.py), and writes the same records."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.run.helpers import multilora_cmd, subprocess_env, write_jsonl

pytestmark = pytest.mark.gpu


def test_a_warm_triton_cache_compiles_nothing(model_dir, tmp_path):
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": str(i), "adapter": a, "prompt": p, "max_tokens": 5 + 3 * i}
            for i, (a, p) in enumerate(
                [("legal", "the court"), ("medical", "the patient"), (None, "a"), ("legal", "b")]
            )
        ],
    )
    env = dict(subprocess_env(), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    runs = []
    for tag in ("cold", "warm"):
        stats, out = tmp_path / f"{tag}.json", tmp_path / f"{tag}.jsonl"
        args = ["run", str(inp), "-m", str(model_dir / "base"), "--device", "cuda", "-q"]
        args += ["-a", f"legal={model_dir / 'legal'},medical={model_dir / 'medical'}", "--stats", str(stats)]
        p = subprocess.run([*multilora_cmd(), *args, "-o", str(out)], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        runs.append((json.loads(stats.read_text())["startup"], out.read_text()))
    (cold, cold_out), (warm, warm_out) = runs
    assert cold["triton_at_start"]["compiled"] > 0, "an empty cache compiles at start (the precompile)"
    assert cold["precompiled"] > 0 and cold["first_step_s"] >= cold["process_s"] > 0
    for phase in ("triton_at_start", "triton_in_steps"):
        assert warm[phase]["compiled"] == 0, f"{phase} recompiled {warm[phase]['kernels']} on a warm cache"
    assert warm["triton_at_start"]["loaded"] > 0
    assert warm_out == cold_out
