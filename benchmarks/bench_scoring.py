"""Scoring and logprobs benchmark: multilora vs HF transformers + PEFT forward, in the same process.

    python -m benchmarks.bench_scoring                                   # Llama-3-8B shapes, 64 adapters (GPU)
    python -m benchmarks.bench_scoring --preset tiny --requests 24 --context-len 32 --continuation-len 4 \\
        --gen-requests 8 --output-len 4 --prompt-len 16 --adapters 4 --hf-batch 4 --hf-batches 2   # CPU smoke

(a) scoring: `--requests` scoring requests (`--context-len` context tokens + `--continuation-len` continuation
    tokens, adapters drawn uniformly from `--adapters` synthetic rank-`--rank` adapters on all 7 projections),
    prefill only, the LM head at the continuation's positions: prompt tokens/s. Baseline: HF + PEFT forward of
    the same rows in batches of `--hf-batch` with mixed `adapter_names` (PEFT's mixed-batch LoRA), full logits
    and an fp32 log_softmax at the continuation's positions (lm-evaluation-harness' HF path), timed over
    `--hf-batches` batches after one warm-up: prompt tokens/s. Target: multilora >= 10x.
(b) generation with `logprobs: 5` vs without: `--gen-requests` greedy requests of `--prompt-len` + `--output-len`
    tokens over the same adapters, the two arms interleaved `--repeats` times on one engine (best of each):
    generated tokens/s ratio. Target >= 0.9x. Each result is counted and dropped as it comes, as a run writes
    and drops its records (a list of every result kept ~460k logprob objects alive at k 5, which the garbage
    collector walked again and again: engine/gc_heap.py); `--keep-results` holds them as before.
(c) on CUDA, the logprob step's parts at `--max-num-seqs` asking rows (device us, medians): the LM head with a
    bf16 output (the sampler's) and with an fp32 output (the logprobs'), the fused logprob rows kernel
    (kernels/logprobs.py) against torch's separate logsumexp / gather / argmax / topk it replaced, their largest
    difference, and the fraction of LM-head outputs where the bf16 GEMM equals the fp32-output GEMM rounded to
    bf16 at M = 1, 16, 64 and the batch; and the one-GEMM pair (Model.compute_logits_pair: the fp32-output GEMM
    and its rounding for the sampler) that replaces both GEMMs where the engine's start-time check passed
    (models/head_check.py; the report's "logprob_lm_head" is that check's outcome, as the run's stats give it).
Writes benchmarks/results/scoring-<device>.json and prints both ratios.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.timing import engine_workload_args, parser, report_start, write_report

SCORING_TARGET, LOGPROBS_TARGET = 10.0, 0.9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def scoring_rows(n: int, ctx: int, cont: int, vocab: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) per request, ids in [10, vocab): the word-level bench tokenizer maps
    "w{id}" to id, so the texts below tokenize back to exactly these ids."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, vocab, (n, ctx + cont)).tolist()
    return [(row[:ctx], row[ctx:]) for row in ids]


def scoring_requests(rows, adapters: list[str | None]):
    from multilora_cli.engine.request import Request

    def text(ids):
        return " ".join(f"w{t}" for t in ids)

    return [
        Request(key=i, id=str(i), adapter=a, prompt=text(c), continuation=" " + text(x))
        for i, ((c, x), a) in enumerate(zip(rows, adapters))
    ]


def time_engine_scoring(engine, reqs, device) -> tuple[float, int]:
    _sync(device)
    t0 = time.perf_counter()
    res = list(engine.generate(reqs))
    _sync(device)
    wall = time.perf_counter() - t0
    bad = [r for r in res if r.error is not None or r.score is None]
    if bad:
        raise RuntimeError(f"{len(bad)} scoring requests failed: {bad[0].error}")
    return wall, sum(r.prompt_tokens for r in res)


def time_hf_scoring(model, rows, adapters, batch: int, batches: int, device) -> dict:
    """HF + PEFT forward over whole = context + continuation[:-1], logprobs of the continuation's tokens."""
    ctx = len(rows[0][0])

    def run(lo: int) -> int:
        part = rows[lo : lo + batch]
        ids = torch.tensor([c + x for c, x in part], device=device)
        names = [a if a is not None else "__base__" for a in adapters[lo : lo + batch]]
        with torch.inference_mode():
            logits = model(input_ids=ids[:, :-1], adapter_names=names).logits  # [B, T - 1, V]
            lp = torch.log_softmax(logits[:, ctx - 1 :].float(), dim=-1)
            lp.gather(-1, ids[:, ctx:, None]).sum()
        return ids.numel()

    run(0)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    tokens = sum(run((i * batch) % max(1, len(rows) - batch + 1)) for i in range(batches))
    _sync(device)
    wall = time.perf_counter() - t0
    return dict(batch=batch, batches=batches, seconds=wall, prompt_tokens=tokens, tokens_per_s=tokens / wall)


def time_generation(engine, reqs, repeats: int, device, keep: bool = False) -> dict:
    """Interleaved arms (plain, logprobs 5) on one engine: best generated tokens/s of each. keep: hold every
    result until the arm ends (the measurement before session 19), else each is dropped once counted."""
    arms = {"plain": reqs, "logprobs5": [replace(r, sampling=replace(r.sampling, logprobs=5)) for r in reqs]}
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, rs in arms.items():
            fresh = [replace(r) for r in rs]  # (requests are not mutated, but keep runs independent)
            _sync(device)
            t0 = time.perf_counter()
            toks, kept = 0, []
            for r in engine.generate(fresh):  # each result counted and dropped, as `multilora run` writes it
                toks += r.completion_tokens
                if keep:
                    kept.append(r)
                if name == "logprobs5" and len(r.samples[0].logprobs) != len(r.token_ids):
                    raise RuntimeError("a logprobs request came back without one entry per token")
            _sync(device)
            wall = time.perf_counter() - t0
            best[name] = max(best.get(name, 0.0), toks / wall)
    return dict(tokens_per_s=best, ratio=best["logprobs5"] / best["plain"], target=LOGPROBS_TARGET)


def logprob_parts(model, rows: int, k: int) -> dict:
    """(c) of the module docstring, on the engine's own model (CUDA only)."""
    from benchmarks.timing import eager_time_us
    from multilora_cli.kernels.logprobs import logprob_rows_torch, logprob_rows_triton

    w = model.lm_head.weight  # [V, H]
    g = torch.Generator(device=w.device).manual_seed(0)
    hidden = torch.randn(rows, w.shape[1], device=w.device, dtype=w.dtype, generator=g)
    x = model.compute_logits_fp32(hidden)  # [rows, V] fp32
    targets = x.argmax(dim=-1)

    def torch_ops(_):  # what engine/logprobs.py ran per chunk before the fused kernel
        lse = torch.logsumexp(x, dim=-1, keepdim=True)
        cols = [x.gather(1, targets[:, None]) - lse, x.argmax(dim=-1, keepdim=True).float()]
        top = torch.topk(x, k, dim=-1)
        cols.append(torch.stack([top.indices.float(), top.values - lse], dim=-1).flatten(1))
        return torch.cat(cols, dim=1)

    us = {
        "lm_head_bf16": eager_time_us(lambda _: model.compute_logits(hidden, upcast=False), 1),
        "lm_head_fp32_out": eager_time_us(lambda _: model.compute_logits_fp32(hidden), 1),
        "lm_head_one_gemm_pair": eager_time_us(lambda _: model.compute_logits_pair(hidden, None), 1),
        "fused_kernel": eager_time_us(lambda _: logprob_rows_triton(x, targets, k), 1),
        "fused_kernel_k20": eager_time_us(lambda _: logprob_rows_triton(x, targets, 20), 1),  # (the largest k)
        "torch_ops_before": eager_time_us(torch_ops, 1),
    }
    fused, ref = logprob_rows_triton(x, targets, k), logprob_rows_torch(x, targets, k)
    equal = {}
    for m in sorted({1, 16, 64, rows}):
        a = model.compute_logits(hidden[:m], upcast=False)
        equal[m] = (a == model.compute_logits_fp32(hidden[:m]).to(a.dtype)).float().mean().item()
    return dict(
        rows=rows,
        k=k,
        vocab=x.shape[1],
        us=us,
        fused_vs_torch_max_abs=max(
            (fused[:, 0] - ref[:, 0]).abs().max().item(), (fused - ref)[:, 3::2].abs().max().item()
        ),
        fused_ids_equal=bool(torch.equal(fused[:, 1], ref[:, 1]) and torch.equal(fused[:, 2::2], ref[:, 2::2])),
        bf16_gemm_equals_fp32_rounded=equal,
    )


def main(argv: list[str] | None = None) -> int:
    from multilora_cli.bench.adapters import SyntheticAdapters, SyntheticEngine
    from multilora_cli.bench.hf_peft import build_hf_peft
    from multilora_cli.bench.model_dir import write_model_dir
    from multilora_cli.bench.suite import device_info, engine_config
    from multilora_cli.bench.workload import Workload
    from multilora_cli.models.config import ModelConfig

    ap = parser(__doc__)
    engine_workload_args(ap, requests=1024)
    ap.add_argument("--context-len", type=int, default=512)
    ap.add_argument("--continuation-len", type=int, default=16)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--hf-batches", type=int, default=4)
    ap.add_argument("--gen-requests", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--keep-results", action="store_true", help="(b) holds every result until its arm ends")
    ap.add_argument("--skip-hf", action="store_true", help="no HF + PEFT baseline (scoring ratio not computed)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    info = device_info(device)
    log = print
    report = report_start("benchmarks.bench_scoring", argv, args, info)
    seq_len = args.context_len + args.continuation_len
    work = Workload(
        preset=args.preset,
        num_adapters=args.adapters,
        rank=args.rank,
        num_requests=args.gen_requests,
        prompt_len=max(args.prompt_len, seq_len),  # (sizes the engine: max_model_len, KV blocks)
        output_len=args.output_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    gen_work = replace(work, prompt_len=args.prompt_len)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / args.preset)
        cfg = ModelConfig.from_dir(model_dir)
        econf = engine_config(work, model_dir, device)
        source = SyntheticAdapters(cfg, work.adapter_names, work.rank, seed=work.seed) if args.adapters else None
        if source is not None:
            source.prepare(getattr(torch, econf.dtype), device)
        assign = Workload.assignment(replace(work, num_requests=args.requests))
        rows = scoring_rows(args.requests, args.context_len, args.continuation_len, cfg.vocab_size, seed=1)
        engine = SyntheticEngine(econf, source, cfg)
        try:
            warm = scoring_rows(min(args.requests, 64), args.context_len, args.continuation_len, cfg.vocab_size, 2)
            time_engine_scoring(engine, scoring_requests(warm, assign[: len(warm)]), device)  # compile, load
            wall, tokens = time_engine_scoring(engine, scoring_requests(rows, assign), device)
            report["scoring_multilora"] = dict(seconds=wall, prompt_tokens=tokens, tokens_per_s=tokens / wall)
            log(f"scoring multilora: {tokens / wall:,.0f} prompt tok/s ({args.requests} requests, {wall:.2f} s)")
            warm = gen_work.requests(cfg.vocab_size)[: min(64, args.gen_requests)]
            # warm-up of both arms (a logprobs line's first step decodes the vocabulary's token texts once)
            engine.generate_all(
                warm + [replace(r, key=-1 - r.key, sampling=replace(r.sampling, logprobs=5)) for r in warm]
            )
            gen = time_generation(engine, gen_work.requests(cfg.vocab_size), args.repeats, device, args.keep_results)
            report["generation_logprobs"] = gen
            head = report["logprob_lm_head"] = engine.runner.head_gemms.stats()
            log(
                f"logprob LM head: {head['path']} ({head['one_gemm_rows']} of {head['max_rows']} row counts; {head['why']})"
            )
            log(
                f"generation: {gen['tokens_per_s']['logprobs5']:,.0f} tok/s with logprobs 5 vs "
                f"{gen['tokens_per_s']['plain']:,.0f} without = {gen['ratio']:.3f}x (target >= {LOGPROBS_TARGET})"
            )
            parts = None
            if device.type == "cuda":
                try:  # (measured beside the engine's KV cache: an out-of-memory here must not lose the report)
                    parts = report["logprob_parts"] = logprob_parts(engine.runner.model, args.max_num_seqs, 5)
                except RuntimeError as e:
                    report["logprob_parts"] = {"error": str(e)[:500]}
                    log(f"logprob step parts: failed: {str(e)[:200]}")
            if parts is not None:
                us = parts["us"]
                log(
                    f"logprob step parts at {args.max_num_seqs} rows (us): LM head bf16 {us['lm_head_bf16']:.0f}, "
                    f"fp32-out {us['lm_head_fp32_out']:.0f}, one-GEMM pair {us['lm_head_one_gemm_pair']:.0f}; fused rows {us['fused_kernel']:.0f} (k 20: "
                    f"{us['fused_kernel_k20']:.0f}) vs torch ops "
                    f"{us['torch_ops_before']:.0f}; bf16 GEMM == fp32-out rounded: "
                    f"{parts['bf16_gemm_equals_fp32_rounded']}"
                )
        finally:
            engine.close()
            del engine
        if not args.skip_hf:
            dtype = getattr(torch, econf.dtype)
            model = build_hf_peft(model_dir, work, device, dtype)
            hf = time_hf_scoring(model, rows, assign, args.hf_batch, args.hf_batches, device)
            report["scoring_hf_peft"] = hf
            ratio = report["scoring_multilora"]["tokens_per_s"] / hf["tokens_per_s"]
            report["scoring_ratio"] = dict(ratio=ratio, target=SCORING_TARGET, met=ratio >= SCORING_TARGET)
            log(f"scoring hf-peft: {hf['tokens_per_s']:,.0f} prompt tok/s -> multilora {ratio:.1f}x (target >= 10)")
    write_report(report, args.out, "scoring", info["name"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
