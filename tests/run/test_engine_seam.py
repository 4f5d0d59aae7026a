"""The seam between the run job and its engines: both engines have JobEngine's surface, EnginePlan maps a
line's adapter name as the job does, and the tests-only signal hook reads its env var."""

from __future__ import annotations

import inspect
import signal
from pathlib import Path

import pytest

from multilora_cli.config import EngineConfig
from multilora_cli.distributed.coordinator import DistributedEngine
from multilora_cli.engine.engine import Engine
from multilora_cli.io.sampling import SamplingFlags
from multilora_cli.run.engine_api import JobEngine
from multilora_cli.run.plan import EnginePlan
from multilora_cli.run.signal_after import TEST_SIGNAL_ENV, SignalAfter

METHODS = ("generate", "annotate_stats", "print_summary", "close")
PROPERTIES = ("slot_loads",)


def test_the_protocol_lists_what_the_job_uses():
    members = {n for n, _ in inspect.getmembers(JobEngine) if not n.startswith("_")}
    assert members == {*METHODS, *PROPERTIES, "default_sampling", "stats"}


@pytest.mark.parametrize("cls", [Engine, DistributedEngine])
def test_both_engines_have_the_surface(cls):
    for name in METHODS:
        assert callable(getattr(cls, name)), name
        want = list(inspect.signature(getattr(JobEngine, name)).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == want, name
    for name in PROPERTIES:
        assert isinstance(inspect.getattr_static(cls, name), property), name
    init = inspect.getsource(cls.__init__)  # instance attributes (Engine) or properties (DistributedEngine.stats)
    for name in ("default_sampling", "stats"):
        assert f"self.{name}" in init or isinstance(inspect.getattr_static(cls, name, None), property), name


def test_plan_maps_adapter_names_like_the_job():
    plan = EnginePlan(
        config=EngineConfig(model="m"),
        adapters={"legal": Path("/a/legal")},
        base_names=frozenset({"base", "tiny"}),
        scans={},
        input="in.jsonl",
        resumed=0,
        sampling=SamplingFlags(),
    )
    assert [plan.engine_adapter(n) for n in (None, "base", "tiny", "legal", "nobody")] == [
        None,
        None,
        None,
        "legal",
        None,
    ]


def test_signal_after_reads_its_env(monkeypatch):
    monkeypatch.delenv(TEST_SIGNAL_ENV, raising=False)
    assert SignalAfter.from_env() is None
    monkeypatch.setenv(TEST_SIGNAL_ENV, "SIGTERM:3")
    hook = SignalAfter.from_env()
    assert hook == SignalAfter(signal.SIGTERM, 3) and not hook.due(2) and hook.due(3) and hook.due(7)


def test_the_plan_bounds_decode_batches_by_the_input(tmp_path):
    """A file input's lines (and their n) bound the decode batches the engine prepares CUDA graphs for; stdin
    leaves it unbounded (io/reader.count_sequences)."""
    from multilora_cli.run.config import EngineFlags, RunConfig
    from multilora_cli.run.job import RunJob, local_engine
    from tests.run.helpers import build_model_dir, write_jsonl

    root = build_model_dir(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "the court", "max_tokens": 2}, {"prompt": "x", "n": 3}])
    seen = []

    def factory(plan: EnginePlan):
        seen.append(plan.config.max_decode_batch)
        return local_engine(plan)

    cfg = RunConfig(
        input=str(src), model=str(root / "base"), output=str(tmp_path / "out.jsonl"), engine=EngineFlags(device="cpu")
    )
    assert RunJob(cfg, engine_factory=factory).run() == 0
    assert seen == [4]
