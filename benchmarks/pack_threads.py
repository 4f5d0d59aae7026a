"""Host cost of packing one Llama-3-8B rank-16 adapter (engine/packed.py) by torch CPU threads per packing
thread, one packer alone and three at once (the prefetch pool), into pageable memory and into a PinnedArena.

    PYTHONPATH=. python3 benchmarks/pack_threads.py
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import torch

from multilora_cli.bench.adapters import SyntheticAdapters
from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.engine.packed import pack_adapter
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.models.config import ModelConfig


def main() -> None:
    cfg = ModelConfig.from_dir(write_model_dir("llama-3-8b", Path(tempfile.mkdtemp()) / "m"))
    src = SyntheticAdapters(cfg, [f"a{i}" for i in range(3)], 16)
    src.prepare(torch.bfloat16, torch.device("cpu"), write=False)
    adapters = [src.load(f"a{i}") for i in range(3)]
    arena = PinnedArena(4 * src.nbytes + (1 << 20), cuda=torch.cuda.is_available())
    print(f"default torch threads {torch.get_num_threads()}, adapter {src.nbytes / 1e6:.0f} MB")
    for threads in (0, 1, 4):
        for concurrent in (1, 3):
            for use_arena in (False, True):
                times = []

                def work(a, times=times, threads=threads, use_arena=use_arena):
                    if threads:
                        torch.set_num_threads(threads)
                    for _ in range(4):
                        t0 = time.perf_counter()
                        p = pack_adapter(a, pin=False, dtype=torch.bfloat16, arena=arena if use_arena else None)
                        times.append(time.perf_counter() - t0)
                        del p

                ts = [threading.Thread(target=work, args=(adapters[i],)) for i in range(concurrent)]
                t0 = time.perf_counter()
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                wall = time.perf_counter() - t0
                times.sort()
                print(
                    f"torch threads {threads or 'default'} x {concurrent} packers, arena {use_arena}: "
                    f"median {times[len(times) // 2] * 1e3:.1f} ms per pack, "
                    f"{4 * concurrent * src.nbytes / wall / 1e9:.2f} GB/s together"
                )


if __name__ == "__main__":
    main()
