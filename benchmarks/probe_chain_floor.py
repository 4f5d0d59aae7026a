"""How close can ANY 8-launch chain get to the kernel benchmark's HBM floor? Pure streaming kernels, same bytes.

    PYTHONPATH=. python3 benchmarks/probe_chain_floor.py --out $OUT/probe-chain-floor.json

For each point (tokens / adapters / rank 16, Llama-3-8B layer) every module's shrink is replaced by a kernel that
only reads its bytes (A of every distinct adapter, then x) and every expand by one that reads B and adds 1 to y
in place: contiguous buffers, no gather, no metadata, no dot, block sizes swept and the best kept. The chain
runs as the layer does (shrink, expand per module, 8 dependent launches) in a CUDA graph with the rotations and
timing of bench_kernels.py, so "ideal chain / floor" is what the launch structure alone costs, and "ours /
ideal chain" is what the SGMV kernels lose to a streaming kernel. Modes: no PDL; PDL (wait first); PDL with the
weights (A, B) read before the wait, as a best case. Also one launch that moves all the layer's bytes, and
(--per-kernel points) each of our 8 kernels alone against its stand-in alone. Results: benchmarks/RESULTS.md,
Kernels, session 16.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

from bench_kernels import MODULES, Case, Pools, device_report, floor_bytes, graph_time_us, ints, rotations_for
from probe_pool_rank import kernel_fns
from multilora_cli.kernels.pdl import gdc_launch_dependents, gdc_wait

SINK_WORDS = 1 << 17
SINK = tl.constexpr(SINK_WORDS)


@triton.jit
def _stream(
    w_ptr, n_w, a_ptr, n_a, out_ptr, RMW: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr, BLOCK: tl.constexpr
):
    """Read w[:n_w]; then read a[:n_a] (RMW: a += 1 in place). int32 words; grid-stride loops."""
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    if PDL and not EARLY:
        gdc_wait()
        gdc_launch_dependents()
    for start in range(pid * BLOCK, n_w, npg * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(w_ptr + offs, mask=offs < n_w, other=0)
    if PDL and EARLY:
        gdc_wait()
        gdc_launch_dependents()
    for start in range(pid * BLOCK, n_a, npg * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(a_ptr + offs, mask=offs < n_a, other=0)
        if RMW:
            tl.store(a_ptr + offs, v + 1, mask=offs < n_a)
        else:
            acc ^= v
    tl.store(out_ptr + pid % SINK, tl.sum(acc))  # a sink: keeps the loads alive


def module_words(t: int, distinct: int, rank: int) -> dict[str, tuple[int, int, int, int]]:
    """module -> (A words, x words, B words, y words), int32 words of bf16 bytes."""
    out = {}
    for n, (in_f, slices) in MODULES.items():
        o = sum(slices)
        out[n] = (distinct * len(slices) * rank * in_f // 2, t * in_f // 2, distinct * o * rank // 2, t * o // 2)
    return out


class Chain:
    """Rotations of the layer's buffers; `run(k)` launches the 8-kernel chain (or the one launch) on rotation k."""

    def __init__(self, words: dict, rotations: int, sms: int):
        self.sms = sms
        self.rot = []
        for _ in range(rotations):
            bufs = {
                n: [torch.randint(-9, 9, (max(w, 1),), dtype=torch.int32, device="cuda") for w in ws]
                for n, ws in words.items()
            }
            self.rot.append(bufs)
        self.words = words
        self.out = torch.empty(SINK_WORDS, dtype=torch.int32, device="cuda")
        self.all_read = [torch.cat([b for n in MODULES for b in (r[n][0], r[n][1], r[n][2])]) for r in self.rot]
        self.all_y = [torch.cat([r[n][3] for n in MODULES]) for r in self.rot]

    def launch(self, w, n_w, a, n_a, rmw, pdl, early, g, block):
        grid = (min(64 * self.sms, max(1, g * self.sms)),) if g > 0 else (triton.cdiv(max(n_w, n_a), block),)
        kw = {"launch_pdl": True} if pdl else {}
        _stream[grid](w, n_w, a, n_a, self.out, RMW=rmw, PDL=pdl, EARLY=early, BLOCK=block, num_warps=4, **kw)

    def kernel(self, k, n, kind, pdl, early, g, block):
        """One streaming stand-in: kind "shrink" reads A then x, "expand" reads B then adds 1 to y."""
        aw, xw, bw, yw = self.words[n]
        a, x, b, y = self.rot[k][n]
        if kind == "shrink":
            self.launch(a, aw, x, xw, False, pdl, early, g, block)
        else:
            self.launch(b, bw, y, yw, True, pdl, early, g, block)

    def chain(self, k, pdl, early, g, block, configs=None):
        """The layer's 8 launches; configs: (module, kind) -> (g, block) overrides the uniform g, block."""
        for n in MODULES:
            for kind in ("shrink", "expand"):
                kg, kb = configs[(n, kind)] if configs else (g, block)
                self.kernel(k, n, kind, pdl, early, kg, kb)

    def one(self, k, g, block):
        w, y = self.all_read[k], self.all_y[k]
        self.launch(w, w.numel(), y, y.numel(), True, False, False, g, block)


def kernel_table(case: Case, pools: Pools, chain: Chain, grids: list[int], blocks: list[int], rot: int):
    """Each of our 8 kernels alone against its streaming stand-in alone (best of PDL off/on, grid, block)."""
    rows, configs = [], {}
    for n in MODULES:
        fns = dict(zip(("shrink", "expand"), kernel_fns(case, pools, n)))
        for kind, fn in fns.items():
            ours = graph_time_us(fn, rot, rep_ms=30)
            best = min(
                (graph_time_us(lambda k: chain.kernel(k, n, kind, pdl, False, g, b), rot, rep_ms=30), g, b, pdl)
                for pdl in (False, True)
                for g in grids
                for b in blocks
            )
            configs[(n, kind)] = best[1:3]
            rows.append(
                dict(
                    module=n,
                    kind=kind,
                    ours_us=ours,
                    stream_us=best[0],
                    ctas_per_sm=best[1],
                    block=best[2],
                    pdl=best[3],
                )
            )
            print(f"  {n} {kind}: ours {ours:.1f} us, stream {best[0]:.1f} ({ours / best[0]:.2f}x)", flush=True)
    return rows, configs


def measure_point(
    t: int, a: int, r: int, grids: list[int], blocks: list[int], l2: int, bw: float, sms: int, per_kernel: bool
) -> dict:
    """Ours (the layer as bench_kernels.py times it) and every streaming mode's best grid / block, one point."""
    distinct = min(t, a)
    fb = floor_bytes(t, distinct, r)
    rot = rotations_for(fb, l2)
    pools = Pools(rot, 64, r)
    pools.set_rank(r)
    case = Case(pools, t, a, r, rot)
    ours = graph_time_us(case.ours, rot)
    chain = Chain(module_words(t, distinct, r), rot, sms)
    row = dict(tokens=t, adapters=a, rank=r, floor_us=fb / bw * 1e6, ours_us=ours, rotations=rot, modes={})
    if per_kernel:
        row["kernels"], configs = kernel_table(case, pools, chain, grids, blocks, rot)
        for name, early in (
            ("chain, PDL, per-kernel best", False),
            ("chain, PDL, weights early, per-kernel best", True),
        ):
            us = graph_time_us(lambda k: chain.chain(k, True, early, 0, 0, configs), rot)
            row["modes"][name] = dict(us=us, ctas_per_sm=None, block=None)
    del case, pools
    modes = {"chain, no PDL": (False, False), "chain, PDL": (True, False), "chain, PDL, weights early": (True, True)}
    for name, (pdl, early) in modes.items():
        best = min(
            (graph_time_us(lambda k: chain.chain(k, pdl, early, g, b), rot), g, b) for g in grids for b in blocks
        )
        row["modes"][name] = dict(us=best[0], ctas_per_sm=best[1], block=best[2])
    best = min((graph_time_us(lambda k: chain.one(k, g, b), rot), g, b) for g in grids for b in blocks)
    row["modes"]["one launch"] = dict(us=best[0], ctas_per_sm=best[1], block=best[2])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="256,64,16;256,16,16;64,64,16;1,1,16")
    ap.add_argument("--grids", default="1,2,4,8,0", help="CTAs per SM (0: one CTA per block of work)")
    ap.add_argument("--blocks", default="1024,2048,4096", help="int32 words per CTA per iteration")
    ap.add_argument("--per-kernel", default="256,64,16", help="points also timed kernel by kernel")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    start = time.time()
    l2, bw, report = device_report()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report["points"] = []
    for spec in args.points.split(";"):
        row = measure_point(
            *ints(spec), ints(args.grids), ints(args.blocks), l2, bw, sms, per_kernel=spec in args.per_kernel.split(";")
        )
        report["points"].append(row)
        fl, ours = row["floor_us"], row["ours_us"]
        print(f"{spec}: floor {fl:.1f} us, ours {ours:.1f} ({ours / fl:.2f}x)", flush=True)
        for name, m in row["modes"].items():
            print(
                f"  {name}: {m['us']:.1f} us ({m['us'] / fl:.2f}x floor; ours / this {ours / m['us']:.2f}) "
                f"g={m['ctas_per_sm']} block={m['block']}",
                flush=True,
            )
        torch.cuda.empty_cache()
    report["elapsed_s"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
