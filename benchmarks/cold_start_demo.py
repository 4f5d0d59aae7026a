"""The demo job as a user runs it, in fresh processes: cold (empty Triton cache) and warm, phase by phase.

Used by `python -m benchmarks.profile_cold_start --demo DIR` (see there). Each run is the README's command
`multilora run prompts.jsonl --adapters legal,medical` in DIR, as `python -m multilora_cli` with `--stats`; the
parent times its wall clock and reads the run's "startup" stats (engine/startup.py): seconds from the process's
start to the engine (imports, pre-flight), the engine's start (precompile, capture, arena), the first step, and
Triton's compiles vs cache loads at start and inside the steps (kernels/compile_log.py), and which kernel path
ran (`kernels`: "triton" on CUDA, "torch" elsewhere; engine/startup.py). A cold run gets a new empty
TRITON_CACHE_DIR; the warm runs after it reuse that directory. Each run's child runs under `python -X importtime`
and its row splits the imports it paid (`imports`: torch_s / triton_s / rest_s / total_s and the largest imports
of the rest; benchmarks/import_split.py; the importtime lines cost the child a few ms of stderr writes). Import
costs are also timed apart, each in its own fresh process: the interpreter alone, torch, torch + triton, and the
modules `multilora run` imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.import_split import LINE, split

ROOT = Path(__file__).resolve().parent.parent  # the repository (its multilora_cli for the child processes)
JOB = ["run", "prompts.jsonl", "--adapters", "legal,medical"]
IMPORTS = {
    "python_s": "pass",
    "torch_s": "import torch",
    "torch_triton_s": "import torch, triton",
    "run_path_s": "import multilora_cli.cli, multilora_cli.run.job, multilora_cli.engine.engine",
}


def child_env(cache: str | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if cache is not None:
        env["TRITON_CACHE_DIR"] = cache
    return env


def entries(cache: str) -> int:
    """Kernels (and launcher modules) in a Triton cache directory: one sub-directory per compiled artifact."""
    return len(os.listdir(cache)) if os.path.isdir(cache) else 0


def time_imports(repeat: int = 2) -> dict:
    """Best of `repeat` fresh processes per import line (the first may read the files from disk)."""
    out = {}
    for key, code in IMPORTS.items():
        best = None
        for _ in range(repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=child_env(None), check=True)
            dt = time.perf_counter() - t
            best = dt if best is None else min(best, dt)
        out[key] = round(best, 3)
    return out


def ensure_demo(demo: Path) -> None:
    if not (demo / "prompts.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "multilora_cli", "demo", str(demo)], env=child_env(None), check=True)


def run_job(demo: Path, cache: str, tag: str, extra: list[str]) -> dict:
    """One fresh `multilora run` of the demo with Triton cache `cache`: wall time, exit code, startup stats."""
    with tempfile.TemporaryDirectory() as tmp:
        stats_path = Path(tmp) / "stats.json"
        before = entries(cache)
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "multilora_cli", *JOB, "--stats", str(stats_path), *extra],
            cwd=demo,
            env=child_env(cache),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall = time.perf_counter() - t
        stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    row = {
        "run": tag,
        "rc": proc.returncode,
        "wall_s": round(wall, 3),
        "job_s": stats.get("wall_seconds"),  # RunJob.run: pre-flight, engine start, generation, writing
        "generate_s": stats.get("generation_seconds"),
        "cache_entries_added": entries(cache) - before,
        **stats.get("startup", {}),
        "imports": split(proc.stderr, top=6),
    }
    if proc.returncode not in (0, 3):
        row["stderr_tail"] = "\n".join(s for s in proc.stderr.splitlines() if not LINE.match(s))[-2000:]
    return row


def profile_demo(demo: Path, runs: list[str], extra: list[str], cache: str | None = None) -> dict:
    """Run the demo job once per item of `runs` ("cold" or "warm"), in order; returns the report's rows."""
    ensure_demo(demo)
    report: dict = {"demo": str(demo), "job": " ".join(["multilora", *JOB, *extra]), "imports": time_imports()}
    own = cache is None
    cache = cache or tempfile.mkdtemp(prefix="triton-cold-")
    rows = []
    try:
        for tag in runs:
            if tag == "cold":  # an empty cache, as in a fresh container
                shutil.rmtree(cache, ignore_errors=True)
                os.makedirs(cache)
            elif tag != "warm":
                raise SystemExit(f"--runs takes cold and warm, got {tag!r}")
            rows.append(run_job(demo, cache, tag, extra))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if own:
            shutil.rmtree(cache, ignore_errors=True)
    report["runs"] = rows
    return report
