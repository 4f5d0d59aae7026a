"""A job's steps compile no Triton kernel on a cold cache (GPU only): the precompile's dry run covers every variant
its lines launch (engine/dry_sample.py by their LineKinds, a base-only step, a slot load). Lines of every
sampling kind the demo has and more: greedy on adapters and the base, top-p, top-k, min-p, a penalty, a
logit_bias (greedy and sampled), min_tokens, logprobs, prompt logprobs, a scoring line, a regex. A second,
warm process compiles nothing either and writes the same records."""

from __future__ import annotations

import pytest

from tests.engine.test_precompile_cover import LINES as COVER_LINES
from tests.run.helpers import run_cold_then_warm, write_jsonl

pytestmark = pytest.mark.gpu

# the CPU cover test's lines (every sampling and processing kind of the demo and more), plus a chat line,
# logprobs, a scoring line and a regex
LINES = [
    *COVER_LINES,
    {"adapter": "medical", "messages": [{"role": "user", "content": "What helps with a dry cough?"}]},
    {"adapter": "legal", "prompt": "The tenant", "logprobs": 3, "prompt_logprobs": 1},
    {"adapter": "legal", "prompt": "The court", "continuation": " held that"},
    {"prompt": "The code is", "regex": "[0-9]{2}-[a-f]{3}", "temperature": 1.0, "seed": 4},
]


def test_a_jobs_steps_compile_nothing_on_a_cold_cache(model_dir, tmp_path):
    pytest.importorskip("llguidance")
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "max_tokens": 6, **x} for i, x in enumerate(LINES)])
    (cold, cold_out), (warm, warm_out) = run_cold_then_warm(model_dir, tmp_path, inp)
    steps = cold["triton_in_steps"]
    assert steps["compiled"] == 0, f"compiled inside the steps: {steps['kernels']}"
    assert cold["triton_at_start"]["compiled"] > 0 and cold["precompiled"] > 0
    for phase in ("triton_at_start", "triton_in_steps"):
        assert warm[phase]["compiled"] == 0, f"{phase} recompiled {warm[phase]['kernels']} on a warm cache"
    assert warm_out == cold_out
    assert list((tmp_path / "triton").glob("multilora-precompiled-*")), "the warm-cache marker"
