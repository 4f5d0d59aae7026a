"""Sliding-window KV (issue 33): blocks behind the window dropped vs every block kept, one engine, one KV cache.

    python -m benchmarks.bench_window --out $OUT/window-h200.json
    python -m benchmarks.bench_window --preset mistral-7b --window 512 --seqs 128 --prompt-len 256 --output-len 1024
    python -m benchmarks.bench_window --preset tiny --window 16 --seqs 8 --prompt-len 24 --output-len 64 \
        --kv-blocks 48 --out /tmp/window-cpu.json             # CPU smoke run

A `--preset` model (random weights: dummy load, bf16 on CUDA) whose every layer slides with `--window` W (Mistral
7B's real window is 4096; a smaller one shows the effect at benchmark lengths) serves --seqs base-model requests of
--prompt-len random tokens and --output-len greedy tokens each (ignore_eos). Both arms run on the SAME engine (same
weights, CUDA graphs and KV cache of --kv-blocks blocks of 16; default: every sequence's window at once,
seqs x (cdiv(W, 16) + 2), far less than their whole contexts): `dropped`, the engine as shipped (a sequence holds its
window's blocks only, engine/block_manager.py), and `kept`, the same engine with its block manager's window unset
(every block kept to the end: fewer sequences fit, the rest wait or are preempted and recomputed). Arms are
interleaved, --repeats times, best tokens/s kept. Read: `ratio` (dropped / kept tokens/s; > 1 where the kept arm
runs out of KV), each arm's peak blocks in use, mean sequences per step, steps and preemptions, and
`same_tokens` (share of requests whose tokens agree between the arms: 1.0 in fp32; bf16 may differ by batch).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.timing import device_header, parser, save_report
from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request

BLOCK = 16


def model_dir(preset: str, window: int, root: Path) -> Path:
    """The preset's model directory with every layer sliding by `window` (Llama-family config keys)."""
    path = write_model_dir(preset, root / preset)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(sliding_window=window, use_sliding_window=True, max_window_layers=0)
    cfg.pop("layer_types", None)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def requests(seqs: int, prompt_len: int, output_len: int, vocab: int) -> list[Request]:
    g = torch.Generator().manual_seed(0)
    return [
        Request(
            key=i,
            id=str(i),
            adapter=None,
            prompt_token_ids=torch.randint(3, vocab, (prompt_len,), generator=g).tolist(),
            sampling=SamplingParams(max_tokens=output_len, ignore_eos=True),
        )
        for i in range(seqs)
    ]


def run_arm(engine: Engine, window: int | None, reqs: list[Request]) -> tuple[dict, list[list[int]]]:
    """One generate_all with the block manager's window set to `window` (None: keep every block)."""
    bm, sched = engine.block_manager, engine.scheduler
    bm.window = window
    peak, running, steps = 0, 0, 0
    postprocess = sched.postprocess

    def observed(batch, *a, **kw):  # every step ends here (run-ahead ones too), its blocks still held
        nonlocal peak, running, steps
        peak, running, steps = max(peak, bm.num_used_blocks), running + batch.num_seqs, steps + 1
        return postprocess(batch, *a, **kw)

    sched.postprocess = observed
    preempted = sched.num_preemptions
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        got = engine.generate_all(reqs)
    finally:
        del sched.postprocess  # back to the class's method
    wall = time.perf_counter() - t0
    assert all(r.error is None for r in got), [r.error for r in got if r.error][:1]
    tokens = sum(len(r.token_ids) for r in got)
    row = dict(
        tokens_per_s=round(tokens / wall, 1),
        wall_s=round(wall, 3),
        output_tokens=tokens,
        peak_blocks=peak,
        mean_running=round(running / max(steps, 1), 1),
        steps=steps,
        preemptions=sched.num_preemptions - preempted,
    )
    return row, [r.token_ids for r in got]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--preset", default="mistral-7b")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--seqs", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--kv-blocks", type=int, default=None, help="default: seqs x (cdiv(window, 16) + 2)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    start = time.time()
    cuda = torch.cuda.is_available()
    blocks = args.kv_blocks or args.seqs * (-(-args.window // BLOCK) + 2)
    if blocks * BLOCK < args.prompt_len + args.output_len:
        raise SystemExit(f"--kv-blocks {blocks} cannot hold one whole sequence: the kept arm could not run")
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(args.preset, args.window, Path(tmp))
        engine = Engine(
            EngineConfig(
                model=str(path),
                device="cuda" if cuda else "cpu",
                dtype="bfloat16" if cuda else "float32",
                max_loras=1,
                max_num_seqs=args.seqs,
                block_size=BLOCK,
                num_kv_blocks=blocks,
                load_format="dummy",
                lazy_capture=False,
                prefix_cache=False,  # every run feeds the same prompts: no run may start from another's blocks
            ),
            {},
        )
        window = engine.block_manager.window
        assert window == args.window, f"the engine serves window {window}, not {args.window}"
        reqs = lambda: requests(args.seqs, args.prompt_len, args.output_len, engine.model_config.vocab_size)  # noqa: E731
        report = dict(
            **device_header("benchmarks.bench_window"),
            preset=args.preset,
            window=args.window,
            seqs=args.seqs,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            kv_blocks=blocks,
            block_size=BLOCK,
            whole_context_blocks=args.seqs * -(-(args.prompt_len + args.output_len) // BLOCK),
            runs=[],
        )
        run_arm(engine, window, requests(2, args.prompt_len, 8, engine.model_config.vocab_size))  # warm-up
        best: dict[str, dict] = {}
        tokens: dict[str, list] = {}
        for rep in range(args.repeats):
            for arm, w in (("dropped", window), ("kept", None)):
                row, tokens[arm] = run_arm(engine, w, reqs())
                report["runs"].append(dict(arm=arm, repeat=rep, **row))
                if arm not in best or row["tokens_per_s"] > best[arm]["tokens_per_s"]:
                    best[arm] = row
                print(arm, rep, row, flush=True)
                if args.out:
                    save_report(report, args.out, start)
        engine.close()
    report["best"] = best
    report["ratio"] = round(best["dropped"]["tokens_per_s"] / best["kept"]["tokens_per_s"], 3)
    report["same_tokens"] = sum(a == b for a, b in zip(tokens["dropped"], tokens["kept"])) / args.seqs
    print(json.dumps({k: report[k] for k in ("ratio", "same_tokens", "best")}, indent=1))
    if args.out:
        save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
