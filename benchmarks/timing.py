"""Timing and report helpers shared by the benchmark tools.

Device times are medians: of CUDA-graph replays or eager calls through triton's `do_bench` (which clears L2
between calls), or of CUDA events around each call. Arms compared inside one process are interleaved and
repeated, and each arm's minimum over the repeats is kept (the run-to-run spread of one machine is ~2-3%, larger
than most of the differences measured). Reports are JSON files carrying the device, the versions, the command
line and the seconds the run took.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


def ints(text: str) -> list[int]:
    """'1,16,256' -> [1, 16, 256] (empty items skipped)."""
    return [int(v) for v in text.split(",") if v]


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose --help prints the tool's whole docstring (its usage lines included)."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command that reproduces this run: `python -m MODULE ARGS` (argv: the tool's arguments, default the
    process's), stored in every report."""
    return " ".join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def copy_bandwidth(device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s of a 1 GiB copy, counting bytes read plus bytes written."""
    from triton.testing import do_bench

    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3)


def matmul_rate() -> float:
    """bf16 matmul rate in FLOP/s of an 8192^3 product (median)."""
    from triton.testing import do_bench

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=10, rep=100, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def graph_time_us(fn: Callable[[int], object], rotations: int, rep_ms: int = 60) -> float:
    """Median time of one rotation in us, from CUDA-graph replays of fn(0) ... fn(rotations - 1).

    Each rotation works on its own copy of the data, so one rotation's bytes are not in L2 for the next."""
    from triton.testing import do_bench

    for k in range(rotations):  # warm-up: compile, allocate
        fn(k)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for k in range(rotations):
            fn(k)
    ms = do_bench(g.replay, warmup=10, rep=rep_ms, return_mode="median")
    del g
    return ms * 1e3 / rotations


def eager_time_us(fn: Callable[[int], object], rotations: int) -> float:
    """Median time of one rotation in us, launched from Python (no graph): what launch overhead costs."""
    from triton.testing import do_bench

    ms = do_bench(lambda: [fn(k) for k in range(rotations)], warmup=5, rep=40, return_mode="median")
    return ms * 1e3 / rotations


def event_times_ms(fn: Callable[[], object], n: int) -> list[float]:
    """GPU time in ms of each of n back-to-back calls of fn, from CUDA events around each (one sync at the end)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def wall_times_s(fn: Callable[[], object], n: int, sync: bool = False) -> list[float]:
    """Host wall time in s of each of n calls of fn (with sync: each call waits for the device too)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def interleaved_min(timers: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Each arm's timer (one median), run `repeats` times with the arms interleaved; the minimum per arm."""
    seen: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, timer in timers.items():
            seen[name].append(timer())
    return {name: min(v) for name, v in seen.items()}


def device_header(module: str, bandwidth: float | None = None) -> dict:
    """The fields every GPU report starts with: device, versions, the command line, the copy bandwidth."""
    import triton

    header = dict(
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        command=command_line(module),
    )
    if bandwidth is not None:
        header["copy_bandwidth_Bps"] = round(bandwidth)
    return header


def save_report(report: dict, path: str | Path, start: float | None = None) -> None:
    """Write the report as JSON (folders created), stamping the seconds since `start` when given. Tools call it
    after every row, so a run cut off by its budget or a timeout keeps what it measured."""
    if start is not None:
        report["elapsed_s"] = round(time.time() - start, 1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


RESULTS_DIR = Path(__file__).resolve().parent / "results"


def engine_workload_args(ap: argparse.ArgumentParser, requests: int) -> None:
    """The flags of the engine benchmarks' synthetic workload (bench_vocab, bench_scoring): a preset's shapes,
    `--adapters` rank-`--rank` adapters, `--requests` requests of `--prompt-len` + `--output-len` tokens, the best
    of `--repeats` timed runs at `--max-num-seqs` running sequences, on `--device`, the report to `--out`."""
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--adapters", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--requests", type=int, default=requests)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)


def report_start(module: str, argv: list[str] | None, args: argparse.Namespace, device: dict) -> dict:
    """A report's first fields: the command line, the device (bench.suite.device_info), the arguments (--out as a
    string)."""
    report: dict = {"command": command_line(module, argv), "device": device, "args": dict(vars(args))}
    report["args"]["out"] = str(args.out) if args.out else None
    return report


def write_report(report: dict, out: Path | None, kind: str, device_name: str) -> Path:
    """Save the report to `out`, else to benchmarks/results/KIND-DEVICE.json (DEVICE the device name's letters and
    digits: 'nvidia-h200'), and say where. Returns the path."""
    if out is None:
        slug = "".join(c if c.isalnum() else "-" for c in device_name.lower()).strip("-")[:40] or "device"
        out = RESULTS_DIR / f"{kind}-{slug}.json"
    save_report(report, out)
    print(f"wrote {out}")
    return out
