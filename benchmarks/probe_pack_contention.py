"""Probe: why a pack takes ~80 ms inside a bench run and ~9 ms alone. Fill methods x packer threads x what else runs.

    python3 benchmarks/probe_pack_contention.py --out $OUT/probe-pack-contention.json

A pack is the copy of one Llama-3-8B rank-16 synthetic adapter (448 tensors, 84 MB) into a block of a page-locked
`PinnedArena`, as the engine's prefetch threads run it (`engine/packed.pack_adapter`). Fill methods:
  cat      torch.cat(out=) with torch's intra-op threads (the engine until now)
  cat1     torch.cat(out=) from a thread whose OpenMP team is 1 (torch.set_num_threads(1) in that thread only)
  numpy    one np.copyto per tensor (single-threaded memcpy, GIL released per tensor)
  memmove  one ctypes.memmove per tensor (the same, through libc)
Background, what the step loop does beside the packs in a run:
  none     nothing
  dma      a thread copying 256 MB host->device from page-locked memory in a loop (the slot loads' copies)
  python   a thread running pure Python (holds the GIL as the step loop's scheduling does)
Per arm: the median ms of one pack and the packs per second of all threads together.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from multilora_cli.bench.adapters import SyntheticAdapters  # noqa: E402
from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
from multilora_cli.engine.pinned import PinnedArena  # noqa: E402
from multilora_cli.models.config import ModelConfig  # noqa: E402


def fill_cat(flat, ps):
    torch.cat(ps, out=flat)


def fill_numpy(flat, ps):
    dst, off = flat.view(torch.uint8).numpy(), 0
    for t in ps:
        b = t.view(torch.uint8).numpy()
        np.copyto(dst[off : off + b.size], b)
        off += b.size


def fill_memmove(flat, ps):
    dst, es = flat.data_ptr(), flat.element_size()
    for t in ps:
        n = t.numel() * es
        ctypes.memmove(dst, t.data_ptr(), n)
        dst += n


FILLS = {"cat": fill_cat, "cat1": fill_cat, "numpy": fill_numpy, "memmove": fill_memmove}


class Background:
    def __init__(self, kind: str, cuda: bool):
        self.kind, self.cuda, self.stop = kind, cuda, threading.Event()
        self.thread = None
        self.count = 0

    def __enter__(self):
        if self.kind == "none" or (self.kind == "dma" and not self.cuda):
            return self
        if self.kind == "dma":
            host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty_like(host, device="cuda")
            stream = torch.cuda.Stream()

            def loop():
                with torch.cuda.stream(stream):
                    while not self.stop.is_set():
                        dev.copy_(host, non_blocking=True)
                        stream.synchronize()
                        self.count += 1
        else:

            def loop():
                while not self.stop.is_set():
                    sum(i * i for i in range(2000))
                    self.count += 1

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--packs", type=int, default=10, help="packs per thread and arm")
    ap.add_argument("--threads", default="1,2,3")
    ap.add_argument("--fills", default="cat,cat1,numpy,memmove")
    ap.add_argument("--backgrounds", default="none,dma,python")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ModelConfig.from_dir(write_model_dir(args.preset, Path(tmp) / "m"))
    names = [f"a{i}" for i in range(8)]
    src = SyntheticAdapters(cfg, names, 16, max_distinct=8)
    src.prepare(torch.bfloat16, torch.device("cuda" if cuda else "cpu"), write=False)
    threads = [int(t) for t in args.threads.split(",")]
    arena = PinnedArena(max(threads) * 2 * (src.nbytes + (1 << 20)), cuda=cuda)
    n0 = torch.get_num_threads()
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch_threads": n0,
        "adapter_mb": src.nbytes / 1e6,
        "packs_per_thread": args.packs,
        "arms": [],
    }

    def parts(i: int) -> list[torch.Tensor]:
        mods = src.load(names[i % len(names)]).modules.values()
        return [t.reshape(-1) for m in mods for t in (m.a, m.b)]

    numel = sum(t.numel() for t in parts(0))
    ref = torch.empty(numel, dtype=torch.bfloat16)
    fill_cat(ref, parts(3))
    for name, fn in FILLS.items():  # every fill writes the same bytes
        out = torch.empty(numel, dtype=torch.bfloat16)
        fn(out, parts(3))
        assert torch.equal(out, ref), name

    def pack(fill, i: int) -> float:
        ps = parts(i)
        block = arena.alloc(numel * 2)
        t0 = time.perf_counter()
        fill(block.tensor(numel, torch.bfloat16), ps)
        dt = time.perf_counter() - t0
        arena.release(block)
        return dt

    for rep in range(2):
        for bg in args.backgrounds.split(","):
            for fname in args.fills.split(","):
                for nt in threads:
                    init = (lambda: torch.set_num_threads(1)) if fname == "cat1" else None
                    with Background(bg, cuda) as b, ThreadPoolExecutor(nt, initializer=init) as ex:
                        t0 = time.perf_counter()
                        ms = list(ex.map(lambda i: pack(FILLS[fname], i), range(nt * args.packs)))
                        wall = time.perf_counter() - t0
                    torch.set_num_threads(n0)  # cat1's initializer also set the default for new threads
                    row = {
                        "rep": rep,
                        "background": bg,
                        "fill": fname,
                        "threads": nt,
                        "ms_median": 1e3 * statistics.median(ms),
                        "packs_per_s": len(ms) / wall,
                        "gb_per_s": len(ms) * src.nbytes / wall / 1e9,
                        "background_iters": b.count,
                    }
                    report["arms"].append(row)
                    print(
                        json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True
                    )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
