"""End-to-end benchmark: multilora (adapters / base only) vs HF transformers + PEFT vs the decode roofline.

    python -m benchmarks.bench_e2e                          # Llama-3-8B shapes, default rows
    python -m benchmarks.bench_e2e --preset llama-3.2-1b --rows 64,base --requests 256
    python -m benchmarks.bench_e2e --rows 64,base,hf64,256/64 --budget-s 420
    python -m benchmarks.bench_e2e --rows 64 --n 8 --temperature 1.0   # n=8 vs 8 separate requests a prompt
    # issue 38: 1,000 adapters, the default slots (a row without /SLOTS) against a --max-loras sweep
    python -m benchmarks.bench_e2e --preset llama-3.2-1b --requests 2048 --distinct-weights 256 \
        --rows 64,1000,1000/64,1000/256,1000/512,1000/1000 --budget-s 420
    # issue 38 at Llama-3-8B shapes: 1,000 adapters (84 GB: a host cache of what fits the pinned share, the rest
    # read from 64 hard-linked files at their loads), default slots; extra.step_vs_roofline is the step at the
    # common batch over the roofline of that step's own distinct adapters
    python -m benchmarks.bench_e2e --preset llama-3-8b --requests 4096 --rows 1000
    python -m benchmarks.bench_e2e --rows 64 --distribution round --shared-prefix 1024 --prompt-len 64 \
        --output-len 64 --prefix-ab          # issue 31: prefix cache on vs off, 64 adapters x 16 sharing 1,024

Rows run in the order given (see multilora_cli/bench/plan.py); with --budget-s, rows that would start after
the budget is spent are recorded as not run. With --n N, every multilora row runs twice in this process: each
prompt as ONE request with n=N (its prefill shared by the N samples), then as N separate requests (the same
texts); --requests counts completions in both. The report's "n_vs_separate" holds their tokens/s ratio (target
>= 1.5 at N=8) and the prompt tokens each fed. With --prefix-ab, every multilora row runs twice: prefix cache on,
then off (--no-prefix-cache); "prefix_cache_ab" holds their tokens/s ratio, target >= 3 with --shared-prefix
(every adapter's prompts share that many leading tokens), >= 0.98 without (nothing to reuse: the cache's cost
alone), and the hit tokens. "slot_sweep" judges each workload's default-slots row against the best row of its
sweep (bench/sweep.py). Writes benchmarks/results/e2e-<device>.json (after every row)
and prints a markdown table. Needs no CLI libraries (typer/rich), only torch, triton, transformers, peft.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from benchmarks.timing import command_line, ints, parser

RESULTS_DIR = Path(__file__).resolve().parent / "results"
N_TARGET = 1.5  # n=8 in one request vs 8 separate requests of the same prompt: tokens/s ratio at least
PREFIX_TARGET = 3.0  # prefix cache on vs off, 1,024 shared + 64 own prompt tokens, 64 out: tokens/s ratio at least
NO_PREFIX_TARGET = 0.98  # the same without shared prefixes: the cache may cost at most 2%


def with_prefix_ab(plan: list) -> list:
    """Each multilora row as a pair: prefix cache on, then off."""
    out = []
    for kind, w in plan:
        if kind == "hf":
            out.append((kind, w))
        else:
            out += [(kind, replace(w, prefix_cache=True)), (kind, replace(w, prefix_cache=False))]
    return out


def prefix_ab(rows: list[dict]) -> list[dict]:
    """Each cache-on row next to its cache-off twin: tokens/s ratio against its target, and the hits."""
    out = []
    for a, b in zip(rows, rows[1:]):
        wa, wb = a["workload"], b["workload"]
        if a["system"] == b["system"] and wa["prefix_cache"] and {**wa, "prefix_cache": False} == wb:
            ratio = a["tokens_per_s"] / b["tokens_per_s"]
            target = PREFIX_TARGET if wa["shared_prefix_len"] else NO_PREFIX_TARGET
            out.append(
                {
                    "system": a["system"],
                    "num_adapters": wa["num_adapters"],
                    "shared_prefix_len": wa["shared_prefix_len"],
                    "tokens_per_s": [a["tokens_per_s"], b["tokens_per_s"]],
                    "ratio": ratio,
                    "target": target,
                    "met": ratio >= target,
                    "prefill_tokens": [a["extra"]["prefill_tokens"], b["extra"]["prefill_tokens"]],
                    "prefix_cache": a["extra"].get("prefix_cache"),
                }
            )
    return out


def with_n(plan: list, n: int) -> list:
    """Each multilora row as a pair: one request with `n` samples a prompt, then `n` separate requests."""
    if n <= 1:
        return plan
    out = []
    for kind, w in plan:
        if kind == "hf":
            out.append((kind, w))
        else:
            out += [(kind, replace(w, n=n)), (kind, replace(w, n=n, separate_n=True))]
    return out


def n_vs_separate(rows: list[dict]) -> list[dict]:
    """Each n-row next to its separate-requests row: tokens/s ratio and the prompt tokens both fed."""
    out = []
    for a, b in zip(rows, rows[1:]):
        wa, wb = a["workload"], b["workload"]
        if wa.get("n", 1) > 1 and not wa["separate_n"] and wb["separate_n"] and {**wa, "separate_n": True} == wb:
            ratio = a["tokens_per_s"] / b["tokens_per_s"]
            out.append(
                {
                    "n": wa["n"],
                    "system": a["system"],
                    "num_adapters": wa["num_adapters"],
                    "tokens_per_s": [a["tokens_per_s"], b["tokens_per_s"]],
                    "ratio": ratio,
                    "target": N_TARGET,
                    "met": ratio >= N_TARGET,
                    "prefill_tokens": [a["extra"]["prefill_tokens"], b["extra"]["prefill_tokens"]],
                }
            )
    return out


def device_slug(name: str) -> str:
    low = name.lower()
    for key in ("h200", "h100", "a100", "l40s", "a10g", "l4", "b200", "cpu"):
        if key in low:
            return key
    return re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "device"


def main(argv: list[str] | None = None, log: Callable[[str], None] | None = None) -> int:
    """Run the rows of `argv` (default: the command line); `log` gets every progress line (default: stdout)."""
    import torch

    from multilora_cli.bench.model_dir import write_model_dir
    from multilora_cli.bench.plan import DEFAULT_ROWS, parse_rows
    from multilora_cli.bench.report import format_table, write_json
    from multilora_cli.bench.suite import device_info, run_suite
    from multilora_cli.bench.workload import Workload

    ap = parser(__doc__)
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--rows", default=DEFAULT_ROWS)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the issue's workload)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument(
        "--n",
        type=int,
        default=1,
        help="samples per prompt: run each multilora row as n=N requests, then as N separate requests",
    )
    ap.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="tokens every prompt of one adapter starts with (before its own --prompt-len tokens)",
    )
    ap.add_argument("--distribution", default="uniform", help="uniform | zipf | round (prompt i -> adapter i %% N)")
    ap.add_argument("--read-threads", type=int, default=8, help="threads copying one adapter's file pieces")
    ap.add_argument("--no-prefix-cache", action="store_true", help="run every row with the prefix cache off")
    ap.add_argument("--prefix-ab", action="store_true", help="run each multilora row with the cache on, then off")
    ap.add_argument("--hf-batch-sizes", default="256,1024")
    ap.add_argument("--hf-new-tokens", default="2,4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=None, help="start no row after this many seconds")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--hf-from",
        type=Path,
        default=None,
        help="take the hf-peft rows from an earlier report of this script (same device and shapes) "
        "instead of re-running them; they are marked as imported",
    )
    ap.add_argument(
        "--host-warm",
        action="store_true",
        help="read + pack each row's adapters into host memory before timing (slots still cold): "
        "a server that preloaded its adapters; default: they are read during the timed run",
    )
    ap.add_argument("--note", default="", help="free text stored in the report (e.g. which A/B arm this is)")
    ap.add_argument(
        "--distinct-weights",
        type=int,
        default=64,
        help="distinct adapter weight files written; the other adapters hard-link them round-robin (each is still "
        "read, validated and packed into its own host cache block, but from the OS page cache)",
    )
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    base = Workload(
        preset=args.preset,
        num_requests=args.requests,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        rank=args.rank,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        distinct_weights=args.distinct_weights,
        distribution=args.distribution,
        shared_prefix_len=args.shared_prefix,
        prefix_cache=not args.no_prefix_cache,
        read_threads=args.read_threads,
    )
    plan = with_n(parse_rows(args.rows, base), args.n)
    if args.prefix_ab:
        plan = with_prefix_ab(plan)
    slug = device_slug(device_info(device)["name"])
    out = args.out or RESULTS_DIR / f"e2e-{slug}.json"
    command = command_line("benchmarks.bench_e2e", argv)

    def on_row(report: dict) -> None:
        report["command"] = command.strip()
        if args.note:
            report["note"] = args.note
        report["shapes"] = {
            "preset": args.preset,
            "rank": args.rank,
            "lora_targets": "q,k,v,o,gate,up,down",
            "requests": args.requests,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "max_num_seqs": args.max_num_seqs,
            "n": args.n,
            "shared_prefix": args.shared_prefix,
            "dtype": "bfloat16" if device.type == "cuda" else "float32",
        }
        if args.n > 1:
            report["n_vs_separate"] = n_vs_separate(report["rows"])
        if args.prefix_ab:
            report["prefix_cache_ab"] = prefix_ab(report["rows"])
        write_json(report, out)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / args.preset)
        report = run_suite(
            plan,
            model_dir,
            device,
            hf_batch_sizes=ints(args.hf_batch_sizes),
            hf_new_tokens=tuple(ints(args.hf_new_tokens)),
            budget_s=args.budget_s,
            log=log or (lambda m: print(m, flush=True)),
            on_row=on_row,
            host_warm=args.host_warm,
        )
    if args.hf_from is not None:
        from multilora_cli.bench.report import target_ratios

        old = json.loads(args.hf_from.read_text())
        for row in old["rows"]:
            if row["system"] == "hf-peft":
                row["extra"]["imported_from"] = f"{args.hf_from.name} ({old['device']['name']})"
                report["rows"].append(row)
        report["targets"] = target_ratios(report["rows"])
    on_row(report)
    print(format_table(report))
    for c in report.get("n_vs_separate", []):
        print(
            f"n={c['n']} vs {c['n']} separate requests ({c['system']}, {c['num_adapters']} adapters): "
            f"{c['tokens_per_s'][0]:.0f} vs {c['tokens_per_s'][1]:.0f} tok/s = {c['ratio']:.2f}x "
            f"(target >= {c['target']}: {'met' if c['met'] else 'missed'}); prompt tokens fed "
            f"{c['prefill_tokens'][0]:,} vs {c['prefill_tokens'][1]:,}"
        )
    for c in report.get("prefix_cache_ab", []):
        pc = c["prefix_cache"] or {}
        print(
            f"prefix cache on vs off ({c['system']}, {c['num_adapters']} adapters, shared prefix "
            f"{c['shared_prefix_len']}): {c['tokens_per_s'][0]:.0f} vs {c['tokens_per_s'][1]:.0f} tok/s = "
            f"{c['ratio']:.2f}x (target >= {c['target']}: {'met' if c['met'] else 'missed'}); hit "
            f"{pc.get('hit_tokens', 0):,} of {pc.get('prompt_tokens', 0):,} prompt tokens; prompt tokens fed "
            f"{c['prefill_tokens'][0]:,} vs {c['prefill_tokens'][1]:,}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
