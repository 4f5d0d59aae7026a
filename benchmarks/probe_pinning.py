"""Probe: what page-locking the adapters' host arena costs, and whether it can run beside GPU work.

    python -m benchmarks.probe_pinning --gib 4 --out $OUT/probe-pinning.json

1. cudaHostRegister of --gib GiB, backed by (a) torch.empty (malloc'd 4 KiB pages), (b) an anonymous mmap with
   MADV_HUGEPAGE (2 MiB transparent huge pages where the kernel allows them), (c) the same, pre-faulted by
   writing it first; (d) torch's own pinned allocator (cudaHostAlloc); the same for malloc'd memory written
   first, and the engine's `PinnedArena` as built now. Each: seconds, and a 1 GiB host->device
   copy's bandwidth and whether the copy returned before finishing (async = truly page-locked).
2. Interference: a main thread runs 20 ms batches of 4096^3 bf16 matmuls, synchronizing each, while another thread
   registers --gib GiB; the batch times beside registration against the same batches alone.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import threading
import time
from pathlib import Path

import torch

from benchmarks.timing import command_line, parser, save_report
from multilora_cli.engine.pinned import PinnedArena

GIB = 1 << 30


def thp() -> dict:
    out = {}
    for name in ("enabled", "defrag"):
        try:
            out[name] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError as e:
            out[name] = f"unreadable: {e}"
    return out


def backing(kind: str, nbytes: int):
    if kind.startswith("malloc"):
        t = torch.empty(nbytes, dtype=torch.uint8)
        if kind == "malloc-prefault":
            t.zero_()
        return t, None
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8)
    if kind == "thp-prefault":
        t.zero_()
    return t, m


def register(t: torch.Tensor) -> float:
    t0 = time.perf_counter()
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    return time.perf_counter() - t0


def h2d(t: torch.Tensor) -> dict:
    dev = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    src = t[:GIB]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dev.copy_(src, non_blocking=True)
    returned = time.perf_counter() - t0
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return {"gb_s": GIB / total / 1e9, "call_returned_s": returned, "total_s": total, "async": returned < 0.5 * total}


def matmul_batches(seconds: float, a, b, until: threading.Thread | None = None) -> list[float]:
    out = []
    end = time.perf_counter() + seconds
    while until.is_alive() if until is not None else time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    n = int(args.gib * GIB)
    torch.cuda.init()
    report = {
        "device": torch.cuda.get_device_name(),
        "gib": args.gib,
        "thp": thp(),
        "cpus": os.cpu_count(),
        "command": command_line("benchmarks.probe_pinning"),
        "register": {},
    }
    for kind in ("malloc", "malloc-prefault", "thp", "thp-prefault", "arena"):
        if kind == "arena":  # what the engine builds (engine/pinned.py), registration included
            t0 = time.perf_counter()
            arena = PinnedArena(n, cuda=True)
            row = {"register_s": time.perf_counter() - t0, **h2d(arena.buf)}
            row["s_per_gib"] = row["register_s"] / args.gib
            arena.close()
            del arena
            report["register"][kind] = row
            print(kind, json.dumps(row), flush=True)
            continue
        t0 = time.perf_counter()
        t, m = backing(kind, n)
        made = time.perf_counter() - t0
        reg = register(t)
        row = {"backing_s": made, "register_s": reg, "s_per_gib": (made + reg) / args.gib, **h2d(t)}
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        del t
        if m is not None:
            m.close()
        report["register"][kind] = row
        print(kind, json.dumps(row), flush=True)
    t0 = time.perf_counter()
    p = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    row = {"register_s": time.perf_counter() - t0, **h2d(p)}
    report["register"]["cudaHostAlloc"] = row
    print("cudaHostAlloc", json.dumps(row), flush=True)
    del p

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    matmul_batches(1.0, a, b)
    alone = matmul_batches(3.0, a, b)
    for kind in ("malloc", "thp"):
        t, m = backing(kind, n)
        box = {}
        th = threading.Thread(target=lambda t=t, box=box: box.setdefault("s", register(t)))
        th.start()
        beside = matmul_batches(0, a, b, until=th)
        th.join()
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        del t
        if m is not None:
            m.close()
        row = {
            "register_s": box["s"],
            "alone_median_ms": 1e3 * statistics.median(alone),
            "alone_max_ms": 1e3 * max(alone),
            "beside_median_ms": 1e3 * statistics.median(beside),
            "beside_max_ms": 1e3 * max(beside),
            "beside_batches": len(beside),
        }
        report[f"interference_{kind}"] = row
        print("interference", kind, json.dumps(row), flush=True)
    if args.out:
        save_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
