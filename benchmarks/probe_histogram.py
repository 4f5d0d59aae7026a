"""Probe: a 16-bin count histogram per (row, chunk), the sampler's compare-per-bin form vs Triton's tl.histogram.

    PYTHONPATH=. python3 benchmarks/probe_histogram.py      # writes $OUT/probe-hist.json (or ./probe-hist.json)

256 rows x 128,256 bf16 logits (N(0, 3)), 8,192-logit chunks, radix levels 0 and 1 of the 16-bit keys. The
compare form is kernels/sample.py's `_histogram` before tl.histogram (counts and masses); tl.histogram is timed
over block sizes and warp counts, and its counts are checked equal to the compare form's. do_bench medians.
"""

import json
import os

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from multilora_cli.kernels.sample import _keys, _weights


@triton.jit
def _compare_hist(row, lo, hi, shift, MASS: tl.constexpr, BLOCK: tl.constexpr):
    """The sampler's histogram before tl.histogram: a [16, BLOCK] compare-and-add per bin (floor 0, prefix 0)."""
    bins = tl.arange(0, 16)
    acc = tl.zeros((16, BLOCK), tl.float32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = tl.load(row + offs, mask=ok, other=0.0)
        key = _keys(raw, 16)
        ok = ok & (key >= 0) & ((key >> (shift + 4)) == 0)
        if MASS:
            w = tl.where(ok, _weights(raw, 1.0, 0.0), 0.0)
        else:
            w = ok.to(tl.float32)
        digit = ((key >> shift) & 15).to(tl.int32)
        acc += tl.where(bins[:, None] == digit[None, :], w[None, :], 0.0)
    return tl.sum(acc, axis=1)


@triton.jit
def k_cur(logits, out, V, stride, LEVEL, MASS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    row = logits + i * stride
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    shift = 12 - 4 * LEVEL
    h = _compare_hist(row, lo, hi, shift, MASS, BLOCK)  # level 0 keeps every key, level 1 almost none (same work)
    tl.store(out + (i * tl.num_programs(1) + c) * 16 + tl.arange(0, 16), h)


@triton.jit
def k_hist(logits, out, V, stride, LEVEL, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    row = logits + i * stride
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    shift = 12 - 4 * LEVEL
    acc = tl.zeros((16,), tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = tl.load(row + offs, mask=ok, other=0.0)
        key = _keys(raw, 16)
        ok = ok & (key >= 0) & ((key >> (shift + 4)) == 0)
        digit = (key >> shift) & 15
        acc += tl.histogram(digit, 16, mask=ok)
    tl.store(out + (i * tl.num_programs(1) + c) * 16 + tl.arange(0, 16), acc.to(tl.float32))


def main():
    torch.manual_seed(0)
    S, V, CH = 256, 128256, 8192
    x = (torch.randn(S, V, device="cuda") * 3).to(torch.bfloat16)
    C = triton.cdiv(V, CH)
    o1 = torch.zeros(S * C * 16, device="cuda")
    o2 = torch.zeros_like(o1)
    o3 = torch.zeros_like(o1)
    res = {}
    for lvl in (0, 1):
        f1 = lambda: k_cur[(S, C)](x, o1, V, x.stride(0), lvl, MASS=False, CHUNK=CH, BLOCK=1024, num_warps=8)
        f3 = lambda: k_cur[(S, C)](x, o3, V, x.stride(0), lvl, MASS=True, CHUNK=CH, BLOCK=1024, num_warps=8)
        for bw in (1024, 2048, 4096):
            for nw in (4, 8, 16):
                f2 = lambda: k_hist[(S, C)](x, o2, V, x.stride(0), lvl, CHUNK=CH, BLOCK=bw, num_warps=nw)
                f2()
                torch.cuda.synchronize()
                res[f"hist lvl{lvl} b{bw} w{nw}"] = do_bench(f2, rep=200)
        f1()
        f3()
        torch.cuda.synchronize()
        res[f"cur count lvl{lvl}"] = do_bench(f1, rep=200)
        res[f"cur mass lvl{lvl}"] = do_bench(f3, rep=200)
        f2 = lambda: k_hist[(S, C)](x, o2, V, x.stride(0), lvl, CHUNK=CH, BLOCK=1024, num_warps=8)
        f2()
        torch.cuda.synchronize()
        res[f"equal lvl{lvl}"] = bool(torch.equal(o1, o2))
    for k, v in res.items():
        print(k, round(v * 1000, 1) if isinstance(v, float) else v)
    with open(os.path.join(os.environ.get("OUT", "."), "probe-hist.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
