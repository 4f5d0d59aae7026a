"""The decode step's sampling cost (engine/sampler.py) per sampling kind, against greedy argmax.

    PYTHONPATH=. python3 benchmarks/bench_sampler.py --out $OUT/sampler-h200.json

Logits [B, V] in the model dtype (bf16), V = Llama-3's 128256, B = decode batch sizes. Per kind, the device time
of everything after the LM head as the runner launches it (eager: the sampler is not in the decode graph):
greedy = argmax over the bf16 logits; the others = `Sampler` on the bf16 logits (plain: temperature only;
top-p, top-k, both), side by side on its two paths: `triton` (kernels/sample.py, radix search, no sort) and
`torch` (the same definition as torch ops, with a [B, V] sort: the baseline). Medians of triton do_bench (eager
launches included, as in the engine), interleaved and repeated, min taken; plus the host time of
`SamplingBatch.build` (which run-ahead overlaps with the device). The bytes floor is one read of the logits.

--baseline FOLDER adds the arm `base`: the kernel path with FOLDER/sample.py (an earlier copy of kernels/sample.py,
e.g. `git show REV:multilora_cli/kernels/sample.py`) in place of the current one, checked token for token against
it. --logits peaked: N(0, 2) logits plus 20 tokens per row raised by 12-20 (the top-0.9 nucleus is among them), closer
to a trained model's than the default N(0, 3), whose top-p nucleus is most of the vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import importlib.util

import torch
from triton.testing import do_bench

from multilora_cli.bench.roofline import measure_bandwidth
from multilora_cli.config import SamplingParams
from multilora_cli.engine import sampler as sampler_mod
from multilora_cli.engine.sampler import Sampler, SamplingBatch

V = 128256
KINDS = {
    "greedy": None,
    "plain": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "top_k": dict(temperature=1.0, top_k=50),
    "top_k+top_p": dict(temperature=1.0, top_k=50, top_p=0.9),
}


CURRENT = sampler_mod.sample_rows
ARMS: dict = {}  # impl -> sample_rows of a baseline copy


def load_baseline(folder: str):
    spec = importlib.util.spec_from_file_location("sample_base", os.path.join(folder, "sample.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.sample_rows


def make_logits(b: int, kind: str, dev, g) -> torch.Tensor:
    x = torch.randn(b, V, device=dev, generator=g)
    if kind == "flat":
        return (x * 3).to(torch.bfloat16)
    x *= 2
    top = torch.randint(0, V, (b, 20), device=dev, generator=g)
    x.scatter_add_(1, top, 12 + 8 * torch.rand(b, 20, device=dev, generator=g))
    return x.to(torch.bfloat16)


def run_kind(logits: torch.Tensor, kind: str, sampler: Sampler, impl: str) -> tuple:
    """(device callable, host seconds of the batch build) for one kind over all rows on path `impl`."""
    if KINDS[kind] is None:
        return (lambda: logits.argmax(dim=-1)), 0.0

    def fn():
        os.environ["MULTILORA_KERNELS"] = "torch" if impl == "torch" else "triton"  # read by use_triton per call
        sampler_mod.sample_rows = ARMS[impl] if impl in ARMS else CURRENT
        return sampler(logits, batch)

    b = logits.shape[0]
    params = [SamplingParams(max_tokens=8, seed=i, **KINDS[kind]) for i in range(b)]
    t0 = time.perf_counter()
    for _ in range(20):
        batch = SamplingBatch.build(params, list(range(b)), [5] * b, V, logits.device)
    host = (time.perf_counter() - t0) / 20
    return fn, host


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", default=None, help="folder with an earlier copy of kernels/sample.py")
    ap.add_argument("--logits", default="flat", help="flat | peaked | flat,peaked")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    impls = ("triton", "torch") + (("base",) if args.baseline else ())
    if args.baseline:
        ARMS["base"] = load_baseline(args.baseline)
    start = time.time()
    dev = torch.device("cuda")
    bw = measure_bandwidth(dev)
    sampler = Sampler()
    report = {
        "device": torch.cuda.get_device_name(),
        "bandwidth_tbs": bw / 1e12,
        "command": " ".join(sys.argv),
        "vocab": V,
        "rows": [],
    }
    g = torch.Generator(device=dev).manual_seed(0)
    for lk, b in ((lk, int(x)) for lk in args.logits.split(",") for x in args.batches.split(",")):
        logits = make_logits(b, lk, dev, g)
        best: dict[tuple, float] = {}
        host: dict[str, float] = {}
        same: dict[str, bool] = {}
        cases = [(k, i) for k in KINDS for i in (("-",) if KINDS[k] is None else impls)]
        for _ in range(args.repeats):
            for kind, impl in cases:
                fn, host[kind] = run_kind(logits, kind, sampler, impl)
                fn()
                ms = do_bench(fn, warmup=5, rep=100, return_mode="median")
                best[kind, impl] = min(best.get((kind, impl), float("inf")), ms * 1e3)
        if args.baseline:  # the arms' tokens, same batch (same u): equal bit for bit?
            for kind in (k for k in KINDS if KINDS[k] is not None):
                toks = [run_kind(logits, kind, sampler, impl)[0]().clone() for impl in ("triton", "base")]
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
    report["elapsed_s"] = round(time.time() - start, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
