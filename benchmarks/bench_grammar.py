"""Structured output's cost: every row under a JSON schema vs the same requests unconstrained, in one process.

    python -m benchmarks.bench_grammar                                   # GPU: Llama-3-8B shapes, 64 adapters, batch 256
    python -m benchmarks.bench_grammar --preset tiny --adapters 4 --batch 8 --requests 16 --output-len 16  # CPU smoke

The model has Llama-3-8B's shapes with random weights (load_format dummy) and a synthetic byte-level BPE tokenizer
of its vocabulary (128,256 ids: bench/byte_vocab.py), so a grammar has real text per token; --adapters synthetic
rank-16 adapters on all 7 projections, requests spread uniformly over them, --batch running sequences, greedy,
--output-len tokens each (ignore_eos). The constrained arm gives every request one of --schemas distinct JSON
schemas (an object with an integer and an array of >= 1024 short strings: it cannot complete within the output
length, so both arms generate the same number of tokens; random weights make random tokens, which the grammar
then constrains heavily, fine for throughput). Arms alternate (free, json, free, json, ...) for --rounds rounds
on ONE engine, after a warm-up of each; the report gives each arm's best tokens/s, their ratio (target >= 0.9),
the grammar's host seconds (worker fill time, and how long steps waited for their mask after queueing the
forward), and the compile time of each distinct schema (llguidance, this tokenizer), plus those of a set of
typical schemas. Writes --out (JSON) and prints a summary.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.timing import command_line, parser

TARGET = 0.9
TYPICAL = {  # compile times of schemas like users send (beside the bench's own)
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}},
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"label": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number"}},
        "required": ["label", "confidence"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "first": {"type": "string", "maxLength": 20},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"],
                    },
                },
                "required": ["first", "address"],
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                    "required": ["sku", "qty"],
                },
                "maxItems": 10,
            },
        },
        "required": ["person", "items"],
    },
}


def bench_schema(i: int) -> dict:
    """Distinct schema i: cannot complete within a few hundred tokens (>= 1024 array items)."""
    return {
        "type": "object",
        "properties": {
            f"id{i}": {"type": "integer"},
            "items": {"type": "array", "items": {"type": "string", "maxLength": 16 + i}, "minItems": 1024},
        },
        "required": [f"id{i}", "items"],
        "additionalProperties": False,
    }


def write_model(preset: str, path: Path) -> Path:
    """The preset's model directory with a byte-level tokenizer of its vocabulary in place of the word-level one."""
    from multilora_cli.bench.byte_vocab import byte_level_tokenizer
    from multilora_cli.bench.model_dir import preset_config, write_model_dir

    write_model_dir(preset, path)
    byte_level_tokenizer(preset_config(preset)["vocab_size"]).save(str(path / "tokenizer.json"))
    return path


def main(argv: list[str] | None = None) -> dict:
    from multilora_cli.bench.adapters import SyntheticAdapters, SyntheticEngine
    from multilora_cli.bench.suite import engine_config
    from multilora_cli.bench.workload import Workload
    from multilora_cli.constraint import parse_constraint
    from multilora_cli.models.config import ModelConfig

    p = parser(__doc__)
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--adapters", type=int, default=64)
    p.add_argument("--batch", type=int, default=256, help="max running sequences")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--schemas", type=int, default=8, help="distinct JSON schemas over the requests")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)

    device = torch.device(a.device)
    work = Workload(
        preset=a.preset,
        num_adapters=a.adapters,
        num_requests=a.requests,
        prompt_len=a.prompt_len,
        output_len=a.output_len,
        max_num_seqs=a.batch,
    )
    tmp = tempfile.TemporaryDirectory(prefix="bench-grammar-")
    model_dir = write_model(a.preset, Path(tmp.name) / "model")
    cfg = ModelConfig.from_dir(model_dir)
    source = SyntheticAdapters(cfg, work.adapter_names, work.rank, seed=work.seed) if a.adapters else None
    econf = replace(engine_config(work, model_dir, device), line_kinds=None)  # constrained rows: every kind
    if source is not None:
        source.prepare(getattr(torch, econf.dtype), device)
    engine = SyntheticEngine(econf, source, cfg)
    cons = [
        parse_constraint(
            {"response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": bench_schema(i)}}}
        )
        for i in range(a.schemas)
    ]

    def arm(reqs, constrained: bool):
        if constrained:
            reqs = [
                replace(r, sampling=replace(r.sampling, constraint=cons[i % len(cons)])) for i, r in enumerate(reqs)
            ]
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        results = list(engine.generate(reqs))
        wall = time.perf_counter() - t0
        bad = [r for r in results if r.error is not None]
        if bad:
            raise RuntimeError(f"{len(bad)} requests failed: {bad[0].error.one_line()}")
        tokens = sum(r.completion_tokens for r in results)
        return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall}

    try:
        warm = replace(work, num_requests=min(a.requests, 2 * a.batch), output_len=min(a.output_len, 32), seed=7)
        for constrained in (False, True):  # Triton kernels, CUDA graphs, the grammar's tokenizer and schemas
            arm(warm.requests(cfg.vocab_size), constrained)
        g = engine.grammar
        runs = {"free": [], "json_schema": []}
        for _ in range(a.rounds):
            for name in runs:
                fill0, wait0, masks0 = g.fill_seconds, g.wait_seconds, g.masks
                r = arm(work.requests(cfg.vocab_size), name == "json_schema")
                r.update(fill_s=g.fill_seconds - fill0, wait_s=g.wait_seconds - wait0, masks=g.masks - masks0)
                runs[name].append(r)
                print(f"  {name}: {r['tokens_per_s']:.0f} tok/s ({r['tokens']} tokens, {r['seconds']:.2f} s)")
        best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
        ratio = best["json_schema"]["tokens_per_s"] / best["free"]["tokens_per_s"]
        comp = g.compiler
        compile_ms = {f"bench{i}": comp.compile_seconds[c] * 1e3 for i, c in enumerate(cons)}
        for name, schema in TYPICAL.items():
            c = parse_constraint({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
            comp.check(c)
            compile_ms[name] = comp.compile_seconds[c] * 1e3
        report = {
            "command": command_line("benchmarks.bench_grammar", argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "workload": {**vars(a)},
            "runs": runs,
            "tokens_per_s": {k: v["tokens_per_s"] for k, v in best.items()},
            "ratio": ratio,
            "target": TARGET,
            "met": ratio >= TARGET,
            "mask_fill_ms_per_step": 1e3 * best["json_schema"]["fill_s"] / max(best["json_schema"]["masks"], 1),
            "mask_wait_ms_per_step": 1e3 * best["json_schema"]["wait_s"] / max(best["json_schema"]["masks"], 1),
            "compile_ms": compile_ms,
        }
    finally:
        engine.close()
        tmp.cleanup()
    print(
        f"json_schema vs free: {ratio:.3f}x (target >= {TARGET}); mask fill {report['mask_fill_ms_per_step']:.2f} ms "
        f"/ step, step waited {report['mask_wait_ms_per_step']:.2f} ms; compile ms: "
        + ", ".join(f"{k} {v:.2f}" for k, v in compile_ms.items())
    )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
