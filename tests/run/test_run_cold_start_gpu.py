"""A run with a warm Triton cache compiles nothing (GPU only): two fresh `multilora run` processes share one new
TRITON_CACHE_DIR; the first compiles its kernels, the second only loads them, before and inside its steps
(the stats' "startup" section: engine/startup.py, kernels/compile_log.py), and writes the same records."""

from __future__ import annotations

import pytest

from tests.run.helpers import run_cold_then_warm, write_jsonl

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
    (cold, cold_out), (warm, warm_out) = run_cold_then_warm(model_dir, tmp_path, inp)
    assert cold["triton_at_start"]["compiled"] > 0, "an empty cache compiles at start (the precompile)"
    assert cold["precompiled"] > 0 and cold["first_step_s"] >= cold["process_s"] > 0
    assert cold["kernels"] == warm["kernels"] == "triton"
    for phase in ("triton_at_start", "triton_in_steps"):
        assert warm[phase]["compiled"] == 0, f"{phase} recompiled {warm[phase]['kernels']} on a warm cache"
    assert warm["triton_at_start"]["loaded"] > 0
    assert warm_out == cold_out
