"""Helpers for `multilora run` tests: a complete tiny model directory (weights + tokenizer + chat template) with
three PEFT-layout adapters, built in about a second from the demo's own writers (random weights, no training),
JSONL files, and the real CLI entry point run in-process or as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ADAPTERS = {  # name -> (rank, alpha, targets)
    "legal": (8, 16, ["q_proj", "v_proj"]),
    "medical": (16, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "code": (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}
REPO = Path(__file__).resolve().parents[2]


def build_model_dir(out: Path, seed: int = 0) -> Path:
    """out/base (HF Llama + tokenizer.json + chat template) and out/{legal,medical,code} PEFT adapters."""
    from multilora_cli.demo import corpus, layout, tinyllama, tokenizer

    lines = [s for d in corpus.DOMAINS for s in corpus.plain_lines(d, 40, seed)]
    tok = tokenizer.train_tokenizer(lines, 400)
    bos, eos, eot = (tok.token_to_id(s) for s in (tokenizer.BOS, tokenizer.EOS, tokenizer.EOT))
    cfg = layout.llama_config(
        tok.get_vocab_size(), bos, [eos, eot], hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, max_len=256
    )
    g = torch.Generator().manual_seed(seed)
    w = tinyllama.init_weights(cfg, g)
    for v in w.values():  # wider than the init so logits are peaked: greedy argmax is never a near-tie
        if v.dim() == 2:
            v.mul_(8.0)
    base = out / "base"
    layout.write_base(base, cfg, w, [eos, eot], max_new_tokens=16)
    tokenizer.write_tokenizer(tok, base, 256)
    for name, (r, alpha, targets) in ADAPTERS.items():
        lora = {}
        for layer in range(cfg["num_hidden_layers"]):
            for m in targets:
                key = f"model.layers.{layer}.{'mlp' if m.endswith(('gate_proj', 'up_proj', 'down_proj')) else 'self_attn'}.{m}"
                wt = w[key + ".weight"]
                lora[key] = (
                    torch.randn(r, wt.shape[1], generator=g) * 0.3,
                    torch.randn(wt.shape[0], r, generator=g) * 0.3,
                    alpha / r,
                )
        layout.write_adapter(out / name, base, lora, r=r, alpha=alpha, targets=targets, use_rslora=False)
    return out


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path_or_bytes) -> list[dict]:
    data = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    return [json.loads(x) for x in data.decode().splitlines() if x.strip()]


def run_cli(args: list[str], stdin: bytes | None = None) -> tuple[int, bytes, str]:
    """Run `multilora` in-process through its real entry point; returns (exit code, stdout bytes, stderr)."""
    from typer.testing import CliRunner

    from multilora_cli.cli import main

    runner = CliRunner()
    with runner.isolation(input=stdin) as (out, err, *_):
        try:
            main(args)
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        stdout = out.getvalue()
        stderr = (err.getvalue() if err is not None else b"").decode()
    return rc, stdout, stderr


def subprocess_env() -> dict:
    # the repository first, then whatever the parent had (packages the test process found must import there too)
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("MULTILORA_DEBUG", None)
    return env


def multilora_cmd() -> list[str]:
    return [sys.executable, "-m", "multilora_cli"]


def run_sub(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(multilora_cmd() + args, capture_output=True, env=subprocess_env(), **kw)


def run_cold_then_warm(model_dir: Path, tmp_path: Path, inp: Path) -> list[tuple[dict, str]]:
    """`multilora run` of `inp` on CUDA with the demo-shaped `model_dir` (base, legal, medical), twice over one
    fresh Triton cache: [(startup stats, output text) of the cold run, the same of the warm run]."""
    env = dict(subprocess_env(), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    runs = []
    for tag in ("cold", "warm"):
        stats, out = tmp_path / f"{tag}.json", tmp_path / f"{tag}.jsonl"
        args = ["run", str(inp), "-m", str(model_dir / "base"), "--device", "cuda", "-q"]
        args += ["-a", f"legal={model_dir / 'legal'},medical={model_dir / 'medical'}", "--stats", str(stats)]
        p = subprocess.run([*multilora_cmd(), *args, "-o", str(out)], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        runs.append((json.loads(stats.read_text())["startup"], out.read_text()))
    return runs
