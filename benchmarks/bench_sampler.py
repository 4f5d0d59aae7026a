"""The decode step's sampling cost (engine/sampler.py) per sampling kind, against greedy argmax.

    python -m benchmarks.bench_sampler --out $OUT/sampler-h200.json
    python -m benchmarks.bench_sampler --baseline .ab/base --logits flat,peaked --out ...   # vs an earlier kernel

Logits [B, V] in the model dtype (bf16), V = Llama-3's 128256, B = decode batch sizes. Per kind, the device time
of everything after the LM head as the runner launches it (eager: the sampler is not in the decode graph):
greedy = argmax over the bf16 logits; the others = what `Sampler` runs on the bf16 logits (plain: temperature
only; top-p, top-k, both), side by side on its two paths: `triton` (kernels/sample.py, radix search, no sort) and
`torch` (the same definition as torch ops, with a [B, V] sort: the baseline). Medians of triton do_bench (eager
launches included, as in the engine), interleaved and repeated, min taken; plus the host time of
`SamplingBatch.build` (which run-ahead overlaps with the device). The bytes floor is one read of the logits.

--baseline FOLDER adds the arm `base`: the kernel path with FOLDER/sample.py (an earlier copy of kernels/sample.py,
e.g. `git show REV:multilora_cli/kernels/sample.py`) in place of the current one, checked token for token against
it. --logits peaked: N(0, 2) logits plus 20 tokens per row raised by 12-20 (the top-0.9 nucleus is among them), closer
to a trained model's than the default N(0, 3), whose top-p nucleus is most of the vocabulary.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Callable

import torch
from triton.testing import do_bench

from benchmarks.timing import command_line, copy_bandwidth, ints, parser, save_report
from multilora_cli.config import SamplingParams
from multilora_cli.engine.sampler import SamplingBatch
from multilora_cli.kernels.sample import sample_rows, sample_rows_torch

V = 128256
KINDS = {
    "greedy": None,
    "plain": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "top_k": dict(temperature=1.0, top_k=50),
    "top_k+top_p": dict(temperature=1.0, top_k=50, top_p=0.9),
}


def load_baseline(folder: str) -> Callable:
    """`sample_rows` of FOLDER/sample.py (an earlier copy of kernels/sample.py), loaded beside the current one."""
    spec = importlib.util.spec_from_file_location("sample_base", os.path.join(folder, "sample.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.sample_rows


def kernel_path(rows_fn: Callable) -> Callable[[torch.Tensor, SamplingBatch], torch.Tensor]:
    """What `Sampler` launches on the GPU (no greedy rows in these batches), with `rows_fn` as the kernel."""

    def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        rows_fn(
            logits,
            batch.rows,
            batch.temp,
            batch.top_k,
            batch.top_p,
            batch.u,
            out,
            any_top_k=batch.any_top_k,
            any_top_p=batch.any_top_p,
        )
        return out

    return sample


def torch_path(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """What `Sampler` runs on the CPU (the same definition as torch ops, with a [B, V] sort), here on the GPU."""
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    out[batch.rows] = sample_rows_torch(logits[batch.rows], batch.temp, batch.top_k, batch.top_p, batch.u)
    return out


def make_logits(b: int, kind: str, dev, g) -> torch.Tensor:
    x = torch.randn(b, V, device=dev, generator=g)
    if kind == "flat":
        return (x * 3).to(torch.bfloat16)
    x *= 2
    top = torch.randint(0, V, (b, 20), device=dev, generator=g)
    x.scatter_add_(1, top, 12 + 8 * torch.rand(b, 20, device=dev, generator=g))
    return x.to(torch.bfloat16)


def run_kind(logits: torch.Tensor, kind: str, paths: dict[str, Callable], impl: str) -> tuple:
    """(device callable, host seconds of the batch build) for one kind over all rows on path `impl`."""
    if KINDS[kind] is None:
        return (lambda: logits.argmax(dim=-1)), 0.0
    b = logits.shape[0]
    params = [SamplingParams(max_tokens=8, seed=i, **KINDS[kind]) for i in range(b)]
    t0 = time.perf_counter()
    for _ in range(20):
        batch = SamplingBatch.build(params, list(range(b)), [5] * b, V, logits.device)
    host = (time.perf_counter() - t0) / 20
    fn = paths[impl]
    return (lambda: fn(logits, batch)), host


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", default=None, help="folder with an earlier copy of kernels/sample.py")
    ap.add_argument("--logits", default="flat", help="flat | peaked | flat,peaked")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    # Sampler's two paths (the kernel on CUDA logits, torch ops on the CPU's), and the baseline kernel's
    paths = {"triton": kernel_path(sample_rows), "torch": torch_path}
    if args.baseline:
        paths["base"] = kernel_path(load_baseline(args.baseline))
    impls = tuple(paths)
    start = time.time()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    report = {
        "device": torch.cuda.get_device_name(),
        "bandwidth_tbs": bw / 1e12,
        "command": command_line("benchmarks.bench_sampler"),
        "vocab": V,
        "rows": [],
    }
    g = torch.Generator(device=dev).manual_seed(0)
    for lk, b in ((lk, x) for lk in args.logits.split(",") for x in ints(args.batches)):
        logits = make_logits(b, lk, dev, g)
        best: dict[tuple, float] = {}
        host: dict[str, float] = {}
        same: dict[str, bool] = {}
        cases = [(k, i) for k in KINDS for i in (("-",) if KINDS[k] is None else impls)]
        for _ in range(args.repeats):
            for kind, impl in cases:
                fn, host[kind] = run_kind(logits, kind, paths, impl)
                fn()
                ms = do_bench(fn, warmup=5, rep=100, return_mode="median")
                best[kind, impl] = min(best.get((kind, impl), float("inf")), ms * 1e3)
        if args.baseline:  # the arms' tokens, same batch (same u): equal bit for bit?
            for kind in (k for k in KINDS if KINDS[k] is not None):
                toks = [run_kind(logits, kind, paths, impl)[0]().clone() for impl in ("triton", "base")]
                same[kind] = bool(torch.equal(*toks))
        floor = logits.numel() * logits.element_size() / bw * 1e6
        for kind, impl in cases:
            us = best[kind, impl]
            row = dict(
                logits=lk,
                batch=b,
                kind=kind,
                impl=impl,
                device_us=round(us, 1),
                host_build_us=round(host[kind] * 1e6, 1),
                floor_us=round(floor, 1),
                vs_greedy=round(us / best["greedy", "-"], 2),
                torch_over_triton=round(best[kind, "torch"] / us, 2) if impl == "triton" else None,
            )
            if impl == "triton" and args.baseline:
                row.update(base_over_triton=round(best[kind, "base"] / us, 2), same_tokens_as_base=same[kind])
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
