"""A job's steps compile no Triton kernel on a cold cache (GPU only): the precompile's dry run covers every variant
its lines launch (engine/dry_sample.py by their LineKinds, a base-only step, a slot load). Lines of every
sampling kind the demo has and more: greedy on adapters and the base, top-p, top-k, min-p, a penalty, a
logit_bias (greedy and sampled), min_tokens, logprobs, prompt logprobs, a scoring line, a regex. A second,
warm process compiles nothing either and writes the same records."""

from __future__ import annotations

import pytest

from tests.run.helpers import run_cold_then_warm, write_jsonl

pytestmark = pytest.mark.gpu

LINES = [
    {"adapter": "legal", "prompt": "The court held that"},
    {"prompt": "Here is one example:"},
    {"adapter": "medical", "messages": [{"role": "user", "content": "What helps with a dry cough?"}]},
    {"adapter": "legal", "prompt": "Remember that", "temperature": 0.8, "top_p": 0.95, "seed": 7},
    {"adapter": "medical", "prompt": "The doctor prescribed", "stop": [" for"]},
    {"prompt": "On Sunday morning we", "temperature": 0.7, "top_k": 20, "seed": 3},
    {"adapter": "medical", "prompt": "The patient", "temperature": 1.0, "min_p": 0.1, "seed": 1},
    {"adapter": "legal", "prompt": "The lease", "temperature": 0.9, "repetition_penalty": 1.3, "seed": 2},
    {"prompt": "The weather", "logit_bias": {"57": 5}},
    {"adapter": "medical", "prompt": "A dry cough", "temperature": 0.9, "top_k": 5, "logit_bias": {"9": -3}},
    {"prompt": "We went", "temperature": 0.6, "min_tokens": 2, "seed": 5},
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
