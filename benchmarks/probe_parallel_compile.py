"""Does Triton compile in parallel from threads? 8 variants of one small dot kernel, one by one vs 8 threads.

    TRITON_CACHE_DIR=$(mktemp -d) python3 benchmarks/probe_parallel_compile.py     # needs CUDA, an empty cache

Session 7 on an H200 host (RESULTS.md, cold start): first launch (launcher + kernel) 2.05 s, 8 variants serial
1.83 s, from 8 threads 0.49 s, launches after `warmup` 5 ms for 8: the basis of engine/precompile.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl


@triton.jit
def _mm(a, b, c, M, N, K, sa, sb, sc, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, V: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(
            a + rm[:, None] * sa + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0
        )
        y = tl.load(
            b + (k + rk)[:, None] * sb + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0
        )
        acc = tl.dot(x, y, acc)
    tl.store(
        c + rm[:, None] * sc + rn[None, :], (acc * V).to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N)
    )


def main() -> None:
    a, b, c = (torch.randn(256, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    args = (a, b, c, 256, 256, 256, 256, 256, 256)

    def warm(v):  # V is a constexpr: each value is one more variant
        _mm.warmup(*args, BM=64, BN=64, BK=32, V=v, grid=(1,))

    def launch(v):
        _mm[(4, 4)](*args, BM=64, BN=64, BK=32, V=v)

    t = time.perf_counter()
    launch(0)
    torch.cuda.synchronize()
    print(f"first launch (launcher + kernel) {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    for v in range(1, 9):
        warm(v)
    print(f"8 variants one by one {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(warm, range(9, 17)))
    print(f"8 variants from 8 threads {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    for v in range(1, 9):
        launch(v)
    torch.cuda.synchronize()
    print(f"8 launches after warmup (in-memory cache hits) {time.perf_counter() - t:.3f} s")


if __name__ == "__main__":
    main()
