"""engine/device_adapters.lora_targets: only the modules some adapter of the run adapts get LoRA layers (from
pre-flight's scans), so a run of attention-only adapters launches and compiles no SGMV kernel in its MLPs; the
tokens are those of an engine with every module adapted (and PEFT's: tests/run/test_run_peft.py)."""

from __future__ import annotations

import pytest

from multilora_cli.adapters.preflight import preflight
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.device_adapters import lora_targets
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.models.config import ModelConfig
from tests.run.helpers import build_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("targets"))


@pytest.fixture(scope="module")
def run(model_dir):
    names = ("legal", "medical", "code")
    pf = preflight({n: str(model_dir / n) for n in names}, str(model_dir / "base"))
    return pf, {n: model_dir / n for n in names}


def test_the_targets_are_the_union_of_the_adapters_modules(run, model_dir):
    pf, paths = run
    cfg = ModelConfig.from_dir(model_dir / "base")
    pick = lambda *ns: {n: paths[n] for n in ns}  # noqa: E731
    assert lora_targets(pick("legal"), pf.scans, cfg) == {"qkv_proj"}  # q, v
    assert lora_targets(pick("legal", "medical"), pf.scans, cfg) == {"qkv_proj", "o_proj"}
    assert lora_targets(pick("legal", "code"), pf.scans, cfg) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    assert lora_targets(pick("legal"), {}, cfg) is None, "an adapter without a scan: every module"
    assert lora_targets({}, {}, cfg) is None


def test_an_engine_adapts_only_the_targets_and_gives_the_same_tokens(run, model_dir):
    pf, paths = run
    adapters = {n: paths[n] for n in ("legal", "medical")}
    config = EngineConfig(model=str(model_dir / "base"), device="cpu", max_loras=2, max_lora_rank=16)
    reqs = lambda: [  # noqa: E731
        Request(key=i, id=str(i), adapter=a, prompt=p, sampling=SamplingParams(max_tokens=5, ignore_eos=True))
        for i, (a, p) in enumerate([("legal", "The court held"), ("medical", "The patient"), (None, "The")])
    ]
    texts = {}
    for tag, scans in (("targets", pf.scans), ("all", None)):
        engine = Engine(config, adapters, scans=scans)
        fused = {m for _, m in engine.runner.model.lora_modules()}
        assert fused == (
            {"qkv_proj", "o_proj"} if tag == "targets" else {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
        )
        texts[tag] = [r.token_ids for r in sorted(engine.generate(reqs()), key=lambda r: r.key)]
    assert texts["targets"] == texts["all"]
