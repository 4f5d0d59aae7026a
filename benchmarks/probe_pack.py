"""Probe: how long the copy inside a pack takes, torch.cat (what `engine/packed.pack_adapter` runs) vs numpy
copies (tried in session 8, rejected), from 1 and from 3 threads.

    python3 benchmarks/probe_pack.py --out $OUT/probe-pack.json

The ~900 tensors of a Llama-3-8B rank-16 synthetic adapter (84 MB) are copied into blocks of a page-locked
`PinnedArena`, as the engine's prefetch threads do: alone, then from 3 threads at once. Both fills run in the same
process on the same sources; their bytes are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from multilora_cli.bench.adapters import SyntheticAdapters  # noqa: E402
from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
import numpy as np  # noqa: E402
from multilora_cli.engine.pinned import PinnedArena  # noqa: E402
from multilora_cli.models.config import ModelConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--packs", type=int, default=12, help="packs per thread and arm")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ModelConfig.from_dir(write_model_dir(args.preset, Path(tmp) / "m"))
    names = [f"a{i}" for i in range(8)]
    src = SyntheticAdapters(cfg, names, 16, max_distinct=4)
    src.prepare(torch.bfloat16, torch.device("cuda" if cuda else "cpu"), write=False)
    arena = PinnedArena(4 * args.packs * (src.nbytes + (1 << 20)), cuda=cuda)
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
        "adapter_mb": src.nbytes / 1e6,
        "arms": {},
    }

    def parts(i: int) -> list[torch.Tensor]:
        mods = src.load(names[i % len(names)]).modules.values()
        return [t.reshape(-1) for m in mods for t in (m.a, m.b)]

    def fill_torch(flat, ps):
        torch.cat(ps, out=flat)

    def fill_numpy(flat, ps):  # one single-threaded memcpy per part, GIL released
        dst, off = flat.view(torch.uint8).numpy(), 0
        for t in ps:
            b = t.view(torch.uint8).numpy()
            np.copyto(dst[off : off + b.size], b)
            off += b.size

    fills = {"torch": fill_torch, "numpy": fill_numpy}
    numel = sum(t.numel() for t in parts(0))
    fill = fills["torch"]

    def pack(i: int) -> float:
        ps = parts(i)
        block = arena.alloc(numel * 2)
        t0 = time.perf_counter()
        fill(block.tensor(numel, torch.bfloat16), ps)
        dt = time.perf_counter() - t0
        arena.release(block)
        return dt

    ref = {}
    for name, fn in fills.items():
        ref[name] = torch.empty(numel, dtype=torch.bfloat16)
        fn(ref[name], parts(1))
    report["bit_identical"] = bool(torch.equal(ref["torch"], ref["numpy"]))
    for rep in range(2):
        for name in fills:
            fill = fills[name]
            one = [pack(i) for i in range(args.packs)]
            with ThreadPoolExecutor(3) as ex:
                t0 = time.perf_counter()
                three = list(ex.map(pack, range(3 * args.packs)))
                wall = time.perf_counter() - t0
            row = {
                "one_thread_ms_median": 1e3 * statistics.median(one),
                "three_threads_ms_median": 1e3 * statistics.median(three),
                "three_threads_packs_per_s": len(three) / wall,
            }
            report["arms"][f"{name}-rep{rep}"] = row
            print(name, rep, json.dumps({k: round(v, 1) for k, v in row.items()}), flush=True)
    print("bit identical:", report["bit_identical"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
