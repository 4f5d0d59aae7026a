"""The precompile's dry run records every sampling-stage kernel variant a job's steps launch (engine/dry_sample.py).

A variant the dry run misses compiles inside a step: on an H200 the demo job compiled 19 `_sample_pass`
variants mid-run (6.5 s) before the kernels stopped specialising on per-step views and the dry run followed the
job's LineKinds. Here a real `multilora run` on CPU (the tiny model of tests/run/helpers.py) draws with the
Triton sampler under the interpreter, its launches recorded while they run (`collect(run=True)`); the variant
keys of its sampling and logits-processing launches must all be among those of `dry_sample` for the job's own
LineKinds (read off its input by the run, as on a GPU). The keys are the ones `compile_all` compiles by
(kernels/launch._variant: constexprs by value, ints and pointers by the classes Triton specialises on).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from multilora_cli.config import LineKind
from multilora_cli.engine.dry_sample import UNKNOWN, dry_sample, logprob_ks, sample_launches
from multilora_cli.kernels.launch import _variant, collect
from tests.run.helpers import build_model_dir, write_jsonl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
SAMPLING_KERNELS = {"_sample_pass", "_process_kernel"}

# the demo's kinds of line (examples/prompts.jsonl: greedy, a top-p and a top-k row, a stop string, the base)
# and the processing ones: a penalty, a logit_bias (greedy and sampled), min_tokens, min_p
LINES = [
    {"adapter": "legal", "prompt": "The court held that"},
    {"prompt": "Here is one example:"},
    {"adapter": "legal", "prompt": "Remember that", "temperature": 0.8, "top_p": 0.95, "seed": 7},
    {"adapter": "medical", "prompt": "The doctor prescribed", "stop": [" for"]},
    {"prompt": "On Sunday morning we", "temperature": 0.7, "top_k": 20, "seed": 3},
    {"adapter": "medical", "prompt": "The patient", "temperature": 1.0, "min_p": 0.1, "seed": 1},
    {"adapter": "legal", "prompt": "The lease", "temperature": 0.9, "repetition_penalty": 1.3, "seed": 2},
    {"prompt": "The weather", "logit_bias": {"57": 5}},
    {"adapter": "medical", "prompt": "A dry cough", "temperature": 0.9, "top_k": 5, "logit_bias": {"9": -3}},
    {"prompt": "We went", "temperature": 0.6, "min_tokens": 2, "seed": 5},
]


def _names(calls) -> list[str]:
    return [getattr(k, "__name__", "") for k, _, _ in calls]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("covermodel"))


@pytest.mark.skipif(not INTERPRET, reason="the Triton sampler on CPU needs TRITON_INTERPRET=1")
def test_the_dry_run_records_every_sampling_variant_a_job_launches(model_dir, tmp_path):
    from multilora_cli.engine.engine import Engine
    from multilora_cli.io.sampling import SamplingFlags
    from multilora_cli.run.config import EngineFlags, RunConfig
    from multilora_cli.run.job import RunJob

    inp = write_jsonl(tmp_path / "in.jsonl", [{**line, "max_tokens": 3} for line in LINES])
    seen = {}

    def engine(plan):
        seen["kinds"] = plan.config.line_kinds
        e = Engine(plan.config, plan.adapters, scans=plan.scans)
        e.runner.sampler.triton = True  # the GPU's sampler, run by the interpreter
        seen["logits"] = torch.zeros(1, e.model_config.vocab_size, dtype=e.runner.dtype)
        return e

    cfg = RunConfig(
        str(inp),
        model=str(model_dir / "base"),
        adapters=[f"{n}={model_dir / n}" for n in ("legal", "medical")],
        output=str(tmp_path / "out.jsonl"),
        sampling=SamplingFlags(),
        quiet=True,
        engine=EngineFlags(device="cpu"),
    )
    with collect(run=True) as steps:
        assert RunJob(cfg, engine).run() == 0
    kinds = seen["kinds"]
    assert kinds is not None and len(kinds) == len(LINES) - 1  # two greedy lines of an adapter: one kind
    step_keys = {_variant(c) for c, n in zip(steps, _names(steps)) if n in SAMPLING_KERNELS}
    assert {n for n in _names(steps) if n in SAMPLING_KERNELS} == SAMPLING_KERNELS  # both kinds of launch ran

    with collect() as dry:
        dry_sample(seen["logits"], kinds)
    dry_keys = {_variant(c) for c in dry}
    missed = step_keys - dry_keys
    assert not missed, f"{len(missed)} of the steps' {len(step_keys)} sampling variants are not precompiled"
    assert len(dry_keys) <= 2 * len(step_keys), "the dry run compiles far more than the steps launch"


@pytest.mark.skipif(not INTERPRET, reason="per-parameter kinds of interpreted kernels: TRITON_INTERPRET=1")
def test_a_sampling_variant_does_not_depend_on_the_rows_or_their_offsets():
    """Steps sample 1, 2, 14 or 256 rows, from views at any offset of the batch's tensors: one variant for all
    (the row count and per-row pointers are not specialised on), so one dry launch per kind covers them."""
    from multilora_cli.kernels.sample import sample_rows

    v = 300
    logits = torch.randn(20, v)
    keys = set()
    for s, at in [(1, 0), (2, 1), (14, 3), (16, 0), (5, 7)]:
        rows = torch.arange(20)[at : at + s]
        t = torch.ones(20)[at : at + s]
        k = torch.full((20,), v)[at : at + s]
        u = torch.rand(21, dtype=torch.float64)[at + 1 : at + 1 + s]
        out = torch.empty(20, dtype=torch.int64)
        with collect() as calls:
            sample_rows(logits, rows, t, k, t * 0.9, u, out, any_top_k=False, any_top_p=True, max_top_k=v)
        keys.add(frozenset(_variant(c) for c in calls))
    assert len(keys) == 1


def test_the_kinds_select_the_launches():
    """Greedy lines sample nothing; a top-k and a top-p line meeting in a step need the full path's top-k passes;
    a penalty line is drawn with the token counts, a bias line without; a greedy processed line goes through the
    processing kernel (with the counts if some processed line has a penalty) and the fp32 copy."""
    v = 1000
    assert sample_launches([LineKind(), LineKind(base=True)], v) == (set(), set())
    calls, _ = sample_launches([LineKind(sampled=True, top_k=20), LineKind(sampled=True, top_p=True)], v)
    assert {(c.topk_path, c.any_top_k, c.any_top_p, c.counts) for c in calls} == {
        (True, True, False, None),
        (False, True, True, None),
    }
    calls, processed = sample_launches(
        [LineKind(sampled=True, penalty=True), LineKind(sampled=True, top_k=2000, bias=True)], v
    )
    assert {c.counts for c in calls} == {True, False} and processed == set()
    assert all(not c.topk_path for c in calls), "a top_k above the vocabulary is the full path"
    calls, processed = sample_launches([LineKind(bias=True), LineKind(sampled=True, penalty=True)], v)
    assert processed == {False, True} and {c.fp32 for c in calls} == {False, True}
    calls, processed = sample_launches([LineKind(sampled=True, min_tokens=True, min_p=True)], v)
    assert {(c.counts, c.min_p) for c in calls} == {(None, True), (False, True)}  # raw once min_tokens is met
    assert logprob_ks([LineKind(logprobs=3), LineKind(prompt_logprobs=0), LineKind()]) == {0, 3}
    assert logprob_ks(UNKNOWN) == {0, 5}
