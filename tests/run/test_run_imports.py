"""`multilora run` imports only what the job uses (cold start, issue 36): a fresh process's sys.modules after
`run --help` and after a plain CPU run of prompt lines (no chat, no constraint, one process)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.run.helpers import subprocess_env, write_jsonl

# never on the path of `run --help`, nor of a plain one-process run of prompt lines
NEVER = (
    "transformers",
    "peft",
    "huggingface_hub",
    "llguidance",
    "jinja2",  # chat templates: only for a chat line
    "matplotlib",
    "rich",
    "multilora_cli.economics",
    "multilora_cli.plot",
    "multilora_cli.bench",
    "multilora_cli.demo",
    "multilora_cli.distributed.launch",  # --data-parallel only
    "multilora_cli.distributed.worker",
    "multilora_cli.distributed.coordinator",
    # Triton kernels whose JIT parsing only some runs need: MoE experts, logprobs, a grammar's token mask
    "multilora_cli.kernels.fused_moe",
    "multilora_cli.kernels.moe_align",
    "multilora_cli.kernels.logprobs",
    "multilora_cli.kernels.bitmask",
)
HELP_NEVER = (*NEVER, "torch", "triton", "numpy", "tokenizers", "multilora_cli.engine", "multilora_cli.run.job")

PROBE = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
from multilora_cli.cli import main
main(sys.argv[1:])
"""


def modules_after(args: list[str], cwd=None) -> tuple[int, set[str], str]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=subprocess_env(), cwd=cwd
    )
    last = p.stderr.strip().splitlines()[-1]
    return p.returncode, set(json.loads(last)), p.stderr


def loaded(mods: set[str], names) -> list[str]:
    return sorted(n for n in names if n in mods or any(m.startswith(n + ".") for m in mods))


def test_run_help_imports_no_engine_and_no_torch():
    rc, mods, err = modules_after(["run", "--help"])
    assert rc == 0, err
    assert "multilora_cli.commands.run" in mods  # the probe saw the command's modules
    assert loaded(mods, HELP_NEVER) == []


def test_a_plain_run_imports_only_what_it_uses(model_dir, tmp_path):
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": "a", "adapter": "legal", "prompt": "the court", "max_tokens": 3}, {"id": "b", "prompt": "x"}],
    )
    args = ["run", str(inp), "-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}"]
    rc, mods, err = modules_after([*args, "--device", "cpu", "-q", "-o", str(tmp_path / "out.jsonl")])
    assert rc == 0, err
    assert "multilora_cli.engine.engine" in mods and "torch" in mods  # it did run the engine
    assert loaded(mods, NEVER) == []
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
