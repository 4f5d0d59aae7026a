"""The decode step's sampling cost (engine/sampler.py) per sampling kind, against greedy argmax.

    python -m benchmarks.bench_sampler --batches 256 --out $OUT/sampler-h200.json          # GPU, Llama-3 vocab
    python -m benchmarks.bench_sampler --vocab 4096 --batch 8 --out /tmp/sampler-cpu.json   # CPU, small shapes
    python -m benchmarks.bench_sampler --baseline .ab/base --logits flat,peaked --out ...   # vs an earlier kernel
    python -m benchmarks.bench_sampler --batches 256 --graph --passes --sweep --out $OUT/sampler-where.json  # where

Logits [B, V] in the model dtype (bf16 on a GPU, fp32 on the CPU, as the runner's), V = Llama-3's 128256 unless
--vocab, B = decode batch sizes. Per kind, the device time of everything after the LM head as the runner
launches it (eager: the sampler is not in the decode graph): greedy = argmax over the logits (the runner's fast
path); the others = `Sampler` on them: plain (temperature only), top-p, top-k, both, top-k 1000, min-p (with top-p),
and `all`: every row with every parameter on (temperature, top-k, top-p, min-p, repetition / frequency / presence
penalties over a history of HISTORY tokens per row (half prompt, half generated), a logit_bias of BIAS entries,
min_tokens still banning the eos ids), which adds the processing (bias, penalties from the device token history,
bans; on the kernel path inside the sampling passes' loads, no fp32 copy) and the history update after the draw.
Passes over [B, V] on the kernel path: top-k (50 and 1000) and `all` (top-k 50) take the top-k path, MODE 8 (chunk
max key16), 9 (distance counts), 7 (sub-bin counts, only for rows whose window of bins overflows the buffer), 5 (the
window's keys buffered) and the row program 6 (`all` processes every load: bias, penalties from the int32 counts,
bans); top-p and min-p the full path, 1 max + 4 weight levels + kept + draw over bf16. The host build of `all` sends
[B]-sized fields only (the bias entries and stop sets sit in the device sequence table, written once per sequence,
outside the timed build). Side by side on its
two paths: `triton` (kernels/sample.py and kernels/penalties.py: no sort) and `torch` (the same definitions as
torch ops, with a [B, V] sort: the baseline); on the CPU the torch path only. GPU: medians of triton do_bench
(eager launches included, as in the engine), interleaved and repeated, min taken; CPU: medians of wall times.
Plus the host time of `SamplingBatch.build` (which run-ahead overlaps with the device). The bytes floor is one
read of the logits.

--baseline FOLDER adds the arm `base`: the kernel path with FOLDER/sample.py (an earlier copy of kernels/sample.py,
e.g. `git show REV:multilora_cli/kernels/sample.py`) in place of the current one, and FOLDER's copies of the
modules it imports from kernels/ where FOLDER has them (sample_row.py, sample_topk.py, penalties.py: the whole
earlier kernel), checked token for token against it (kinds without min-p and processing). --logits peaked:
N(0, 2) logits plus 20 tokens per row raised by 12-20 (the top-0.9 nucleus is among them), closer to a trained
model's than the default N(0, 3), whose top-p nucleus is most of the vocabulary.

Where the time goes (GPU, the triton arm): --graph adds per kind `graph_us` (the Sampler's kernel launches for
its sampled rows replayed from a CUDA graph: their device time alone, no launch overhead, no argmax or history
update) and `host_us` (the host time of one eager Sampler call, median: when it is above graph_us, the eager
device_us measures the host). On the first --logits kind and batch only: --passes adds per kind the kernel
passes one by one (rows `kind: "pass"`, mode / level as kernels/sample.py numbers them, device us from
torch.profiler, median of PASS_CALLS calls); --sweep times the kernel launches alone (sample_rows as the Sampler
calls it) with each of SWEEP's options (chunk, block, warps, the count levels' and distance counts' packed
counters: packed_counts=False times Triton's histogram instead), each checked token for token against the defaults (`same_tokens`: a chunk size sums the full path's weights in another
order, so a draw at a rounding boundary may differ there).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

from benchmarks.timing import command_line, copy_bandwidth, graph_time_us, ints, parser, save_report, wall_times_s
from multilora_cli.config import SamplingParams
from multilora_cli.engine.logits_processing import TokenHistory
from multilora_cli.engine.request import Request
from multilora_cli.engine.sampler import Sampler, SamplingBatch
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.kernels.launch import collect, compile_all
from multilora_cli.kernels.sample import TOPK_PATH_MAX, _sample_pass, sample_rows

PASS_CALLS = 10
SWEEP_KINDS = ("top_k", "top_k+top_p", "min_p", "all")
# sample_rows options against its defaults (chunk 8192, block 1024, 4 warps, packed counters); `block` only
# on the top-k path (the full path's weight levels hold a [16, block] accumulator: above 1024 it spills)
SWEEP = [
    dict(chunk=4096),
    dict(chunk=16384),
    dict(block=512),
    dict(block=2048),
    dict(num_warps=8),
    dict(packed_counts=False),
]
V = 128256
EOS = (128001, 128009)  # Llama-3 Instruct's eos ids (min_tokens bans them), folded into the vocabulary when smaller
HISTORY = 512  # tokens per row the penalties read: HISTORY // 2 of prompt, HISTORY // 2 generated
BIAS = 10  # logit_bias entries per row
KINDS = {
    "greedy": None,
    "plain": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "top_k": dict(temperature=1.0, top_k=50),
    "top_k+top_p": dict(temperature=1.0, top_k=50, top_p=0.9),
    # the top-k path's largest k: its window of distance bins overflows the wide buffer on most peaked rows (and
    # a few flat ones), which the sub-bin pass (MODE 7) narrows to ~k keys
    "top_k1000": dict(temperature=1.0, top_k=1000),
    "min_p": dict(temperature=1.0, top_p=0.9, min_p=0.05),
    "all": dict(
        temperature=1.0,
        top_k=50,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.1,
        frequency_penalty=0.5,
        presence_penalty=0.3,
        min_tokens=HISTORY,  # the rows sit at position HISTORY // 2: eos still banned
        max_tokens=2 * HISTORY,
    ),
}
OLD_KERNEL_KINDS = (
    "plain",
    "top_p",
    "top_k",
    "top_k+top_p",
    "top_k1000",
)  # what an earlier sample.py (--baseline) can run


def load_baseline(folder: str) -> Callable:
    """`sample_rows` of FOLDER/sample.py (an earlier copy of kernels/sample.py), loaded beside the current one; the
    kernels/ modules it imports are FOLDER's copies where it has them (in sys.modules while it loads, then the
    current ones again)."""
    order = ["penalties", "exceptions", "sample_row", "sample_topk"]  # (each after those it imports; an earlier
    # kernel may have exceptions.py)
    names = sorted(
        (f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "sample.py"),
        key=lambda n: order.index(n) if n in order else len(order),
    )
    saved = {}
    try:
        for name in names:
            full = f"multilora_cli.kernels.{name}"
            saved[full] = sys.modules.get(full)
            spec = importlib.util.spec_from_file_location(full, os.path.join(folder, name + ".py"))
            sys.modules[full] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[full])
        spec = importlib.util.spec_from_file_location("sample_base", os.path.join(folder, "sample.py"))
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
    finally:
        for full, mod in saved.items():
            if mod is None:
                sys.modules.pop(full, None)
            else:
                sys.modules[full] = mod
    return m.sample_rows


def kernel_path(rows_fn: Callable) -> Callable[[torch.Tensor, SamplingBatch], torch.Tensor]:
    """`Sampler`'s kernel launch for batches of sampled plain rows only, all on one path, with `rows_fn` as the
    kernel (given the largest top-k where it takes one, as the Sampler does: else it reads it off the device)."""
    takes_max = "max_top_k" in inspect.signature(rows_fn).parameters

    def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        d = batch.plain
        out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        kw = dict(max_top_k=d.max_top_k if d.num_topk else logits.shape[1]) if takes_max else {}
        rows_fn(logits, d.rows, d.temp, d.top_k, d.top_p, d.u, out, any_top_k=d.any_top_k, any_top_p=d.any_top_p, **kw)
        return out

    return sample


def kernel_launches(logits: torch.Tensor, batch: SamplingBatch, **kw) -> Callable[[], torch.Tensor]:
    """The Sampler's kernel launches for the sampled rows of `batch` (no argmax, no history update), with the
    sample_rows options `kw`: a function that launches them and returns the ids written (plain rows' outputs,
    then the processed rows')."""
    v = logits.shape[1]
    sets = [(batch.plain, None, logits.shape[0])]
    if batch.processing is not None:
        sets.append((batch.processing_draws, batch.processing.plan, batch.processing.plan.num_rows))
    outs = [torch.zeros(n, dtype=torch.long, device=logits.device) for _, _, n in sets]

    def run() -> torch.Tensor:
        for (d, plan, _), out in zip(sets, outs):
            n = d.num_topk
            for part, topk in ((slice(0, n), True), (slice(n, None), False)):  # as engine/sampler._draw
                if (n if topk else d.rows.numel() - n) == 0:
                    continue
                sample_rows(
                    logits, d.rows[part], d.temp[part], d.top_k[part], d.top_p[part], d.u[part], out,
                    min_p=d.min_p[part], plan=plan, any_top_k=d.any_top_k, any_top_p=d.any_top_p,
                    any_min_p=d.any_min_p, max_top_k=d.max_top_k if topk else v,
                    topk_path_max=TOPK_PATH_MAX if topk else 0, **kw,
                )  # fmt: skip
        return torch.cat(outs)

    return run


def swept(kind: str) -> list[dict]:
    """SWEEP's options that apply to `kind` (block and packed counters: the top-k path only, min_p's full path
    has weight levels)."""
    return [cfg for cfg in SWEEP if not (kind == "min_p" and ("block" in cfg or "packed_counts" in cfg))]


def precompile(logits: torch.Tensor, batches: dict, sweep: bool) -> int:
    """Compile the kernel variants the run launches (each kind's, and with --sweep SWEEP's) in parallel before
    timing anything (kernels/launch.compile_all; one by one, the sweep's ~40 variants took most of the run)."""
    with collect() as calls:
        for kind, (batch, _) in batches.items():
            for cfg in [{}] + (swept(kind) if sweep and kind in SWEEP_KINDS else []):
                kernel_launches(logits, batch, **cfg)()
    return compile_all(calls)


def pass_times(run: Callable[[], torch.Tensor]) -> list[dict]:
    """Device us of each kernel pass `run` launches (median of PASS_CALLS calls, torch.profiler), labelled with
    its MODE and LEVEL as recorded by a dry run (launch.collect)."""
    from torch.profiler import ProfilerActivity, profile

    with collect() as calls:
        run()
    at = _sample_pass.arg_names.index("LEVEL")
    labels = [(kw["MODE"], args[at]) for _, args, kw in calls]
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PASS_CALLS):
            run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = sorted((e for e in kernels if "_sample_pass" in e.name), key=lambda e: e.time_range.start)
    if len(kernels) != len(labels) * PASS_CALLS:
        return [dict(error=f"{len(kernels)} kernels profiled, {len(labels)} x {PASS_CALLS} launched")]
    per = [[] for _ in labels]
    for j, e in enumerate(kernels):
        per[j % len(labels)].append(e.time_range.elapsed_us())
    return [dict(mode=m, level=lvl, us=round(statistics.median(t), 1)) for (m, lvl), t in zip(labels, per)]


def where_time_goes(logits: torch.Tensor, batch: SamplingBatch, sampler: Callable) -> dict:
    """graph_us: the kernel launches of `batch` (kernel_launches) replayed from a CUDA graph, device time alone;
    host_us: the host time of one eager `sampler` call (median of 50, no sync between: the launch queue is deep
    enough). A failure is reported in the row, not raised (the other rows still get measured)."""
    out = {}
    try:
        run = kernel_launches(logits, batch)
        out["graph_us"] = round(graph_time_us(lambda _k: run(), 1), 1)
    except Exception as e:  # noqa: BLE001 (a measurement that cannot run says why in its row)
        out["graph_error"] = repr(e)[:300]
    torch.cuda.synchronize()
    fn = lambda: sampler(logits, batch)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    out["host_us"] = round(statistics.median(wall_times_s(fn, 50)) * 1e6, 1)
    torch.cuda.synchronize()
    return out


def make_logits(b: int, v: int, kind: str, dev, dtype, g) -> torch.Tensor:
    x = torch.randn(b, v, device=dev, generator=g)
    if kind == "flat":
        return (x * 3).to(dtype)
    x *= 2
    top = torch.randint(0, v, (b, 20), device=dev, generator=g)
    x.scatter_add_(1, top, 12 + 8 * torch.rand(b, 20, device=dev, generator=g))
    return x.to(dtype)


def history_seqs(params: list[SamplingParams], v: int, g: torch.Generator) -> list[Sequence]:
    """Running sequences with HISTORY tokens each (random ids), at completion position HISTORY // 2."""
    half = HISTORY // 2
    seqs = []
    for i, sp in enumerate(params):
        toks = torch.randint(0, v, (HISTORY,), generator=g).tolist()
        s = Sequence.from_request(i, Request(key=i, id=str(i), sampling=sp), toks[:half])
        s.token_ids += toks[half:]
        s.status = SeqStatus.RUNNING
        seqs.append(s)
    return seqs


def build_batch(logits: torch.Tensor, kind: str, g: torch.Generator) -> tuple[SamplingBatch, float]:
    """(the SamplingBatch of kind `kind` over all rows, host seconds of one build). `all` rows also get their
    logit_bias and their token history written on the device (outside the timed build)."""
    b, v = logits.shape
    eos = tuple(t % v for t in EOS)
    if kind != "all":
        params = [SamplingParams(max_tokens=8, seed=i, **KINDS[kind]) for i in range(b)]

        def build():
            return SamplingBatch.build(params, list(range(b)), [5] * b, v, logits.device)

    else:
        params = []
        for i in range(b):
            toks = torch.randint(0, v, (BIAS,), generator=g).tolist()
            bias = {t: (-1) ** j * (1.0 + j) for j, t in enumerate(dict.fromkeys(toks))}
            params.append(SamplingParams(seed=i, logit_bias=bias, **KINDS["all"]))
        seqs = history_seqs(params, v, g)
        history = TokenHistory(b, v, logits.device)
        history.rows_for(seqs, eos_token_ids=eos)  # (the tables and counts, written once as in the runner)

        def build():
            return SamplingBatch.for_seqs(seqs, v, logits.device, history=history, eos_token_ids=eos)

    t0 = time.perf_counter()
    for _ in range(20):
        batch = build()
    return batch, (time.perf_counter() - t0) / 20


def device_us(fn: Callable[[], object], cuda: bool) -> float:
    """Median device time of fn in us: triton's do_bench on CUDA, wall times on the CPU."""
    fn()
    if cuda:
        from triton.testing import do_bench

        return do_bench(fn, warmup=5, rep=100, return_mode="median") * 1e3
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--batches", "--batch", dest="batches", default="64,256")
    ap.add_argument("--vocab", type=int, default=V)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", default=None, help="folder with an earlier copy of kernels/sample.py")
    ap.add_argument("--logits", default="flat", help="flat | peaked | flat,peaked")
    ap.add_argument("--graph", action="store_true", help="graph_us and host_us per kind (triton arm)")
    ap.add_argument("--passes", action="store_true", help="device us per kernel pass per kind (triton arm)")
    ap.add_argument("--sweep", action="store_true", help="kernel launches per chunk / block / warps / counters")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    start = time.time()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32  # the runner's logits: the model dtype
    # Sampler's two paths (the kernels on CUDA logits, torch ops on the CPU's), and the baseline kernel's
    paths: dict[str, Callable] = {"triton": Sampler(triton=True)} if cuda else {}
    paths["torch"] = Sampler(triton=False)
    if args.baseline:
        paths["base"] = kernel_path(load_baseline(args.baseline))
    bw = copy_bandwidth() if cuda else None
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "bandwidth_tbs": bw / 1e12 if bw else None,
        "command": command_line("benchmarks.bench_sampler"),
        "vocab": args.vocab,
        "logits_dtype": str(dtype).removeprefix("torch."),
        "all": {k: v for k, v in KINDS["all"].items()} | {"history_tokens": HISTORY, "logit_bias_entries": BIAS},
        "rows": [],
    }
    g = torch.Generator(device=dev).manual_seed(0)
    gh = torch.Generator().manual_seed(0)
    for lk, b in ((lk, x) for lk in args.logits.split(",") for x in ints(args.batches)):
        logits = make_logits(b, args.vocab, lk, dev, dtype, g)
        batches = {k: build_batch(logits, k, gh) for k in KINDS if KINDS[k] is not None}
        if cuda:
            t0 = time.time()
            n = precompile(logits, batches, args.sweep)
            print(f"# {n} kernel variants compiled or loaded in {time.time() - t0:.1f} s", flush=True)
        best: dict[tuple, float] = {}
        same: dict[str, bool] = {}

        def arms(kind):
            if KINDS[kind] is None:
                return ("-",)
            return tuple(i for i in paths if i != "base" or kind in OLD_KERNEL_KINDS)

        cases = [(k, i) for k in KINDS for i in arms(k)]
        for _ in range(args.repeats):
            for kind, impl in cases:
                if KINDS[kind] is None:
                    fn = lambda: logits.argmax(dim=-1)  # noqa: E731
                else:
                    fn = (lambda p, bt: lambda: p(logits, bt))(paths[impl], batches[kind][0])
                us = device_us(fn, cuda)
                best[kind, impl] = min(best.get((kind, impl), float("inf")), us)
        if args.baseline:  # the arms' tokens, same batch (same u): equal bit for bit?
            for kind in OLD_KERNEL_KINDS:
                toks = [paths[i](logits, batches[kind][0]).clone() for i in ("triton", "base")]
                same[kind] = bool(torch.equal(*toks))
        floor = logits.numel() * logits.element_size() / bw * 1e6 if bw else None
        for kind, impl in cases:
            us = best[kind, impl]
            row = dict(
                logits=lk,
                batch=b,
                kind=kind,
                impl=impl,
                device_us=round(us, 1),
                host_build_us=round(batches[kind][1] * 1e6, 1) if kind in batches else 0.0,
                floor_us=round(floor, 1) if floor else None,
                vs_greedy=round(us / best["greedy", "-"], 2),
                vs_plain=round(us / best["plain", impl], 2) if impl in ("triton", "torch") else None,
                torch_over_triton=round(best[kind, "torch"] / us, 2) if impl == "triton" else None,
            )
            if impl == "triton" and args.baseline and kind in OLD_KERNEL_KINDS:
                row.update(base_over_triton=round(best[kind, "base"] / us, 2), same_tokens_as_base=same[kind])
            if impl == "triton" and args.graph:
                row.update(where_time_goes(logits, batches[kind][0], paths[impl]))
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
        first = lk == args.logits.split(",")[0] and b == ints(args.batches)[0]  # (passes, sweep: once a run)
        for kind in KINDS if cuda and first and (args.passes or args.sweep) else ():
            if KINDS[kind] is None:
                continue
            if args.passes:
                try:
                    passes = pass_times(kernel_launches(logits, batches[kind][0]))
                except Exception as e:  # noqa: BLE001 (as in where_time_goes)
                    passes = [dict(error=repr(e)[:300])]
                row = dict(logits=lk, batch=b, kind="pass", of=kind, passes=passes)
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
            if args.sweep and kind in SWEEP_KINDS:
                base_run = kernel_launches(logits, batches[kind][0])
                want = base_run().clone()
                row = dict(logits=lk, batch=b, kind="sweep", of=kind, default_us=round(device_us(base_run, cuda), 1))
                alts = []
                for cfg in swept(kind):
                    alt = kernel_launches(logits, batches[kind][0], **cfg)
                    same = bool(torch.equal(alt(), want))
                    alts.append(dict(cfg, us=round(device_us(alt, cuda), 1), same_tokens=same))
                row["alternatives"] = alts
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
        if args.out:
            save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
