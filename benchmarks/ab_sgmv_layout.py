"""A/B in one process: the SGMV kernels on the committed slot layout vs a 128-column tiled layout.

    PYTHONPATH=. python3 benchmarks/ab_sgmv_layout.py --out benchmarks/results/kernels-layout-<device>.json

Hypothesis: at decode sizes the kernels stream A and B at ~60% of copy bandwidth because each CTA's tile is
RB rows of 256 bytes that sit one whole row (8-57 KB) apart, so nearly every 256-byte read opens a new DRAM
page. Tiled layout: A as [L, S, in/128, R, 128] and B as [L, out/128, R, 128], so the first r rank rows of a
128-wide block are ONE contiguous run of r*256 bytes. Same tiles, same dots, same accumulation order as the
committed kernels (rank-16 bucket only: enough to test the hypothesis), so results must be bit-identical.
Timing as bench_kernels.py (CUDA-graph replays of K rotations, L2 cleared between replays).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl

from bench_kernels import MODULES, Case, Pools, bandwidth, floor_bytes, graph_time_us, ints, rotations_for
from multilora_cli.kernels.blocks import expand_blocks, shrink_blocks, tile_index
from multilora_cli.kernels.checks import tile_grid
from multilora_cli.kernels.sgmv_expand import lora_expand
from multilora_cli.kernels.sgmv_shrink import lora_shrink

TW = 128  # tile width of the tiled layout


@triton.jit
def _shrink_tiled(x_ptr, a_ptr, rank_ptr, scale_ptr, idx_ptr, tiles_ptr, s_ptr, K, k_per_split, tile_cap, n_slices,
                  stride_xt, stride_a_slot, stride_a_slice, stride_a_kb, stride_s_split, stride_s_t, stride_s_slice,
                  NSP: tl.constexpr, NSPM: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, TWC: tl.constexpr):
    pid_tile = tl.program_id(0)
    pid_k = tl.program_id(2)
    slot = tl.load(tiles_ptr + pid_tile)
    if slot < 0:
        return
    lo = tl.load(tiles_ptr + tile_cap + pid_tile)
    hi = tl.load(tiles_ptr + 2 * tile_cap + pid_tile)
    slot64 = slot.to(tl.int64)
    rank_row = rank_ptr + slot64 * n_slices
    scale_row = scale_ptr + slot64 * n_slices
    m = tl.arange(0, BM)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)
    n = tl.arange(0, NSP * 16)
    sl = n // 16
    j = n % 16
    sl_ok = sl < n_slices
    r = tl.load(rank_row + sl, mask=sl_ok, other=0)
    col_ok = j < r
    offs_k = tl.arange(0, BK)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    a_slot = a_ptr + slot64 * stride_a_slot
    x_ptrs = x_ptr + rows[:, None] * stride_xt + offs_k[None, :]
    # tiled: element (slice, rank j, k) at slice*S + (k // TW)*S_kb + j*TW + k % TW
    a_ptrs = a_slot + sl[None, :] * stride_a_slice + j[None, :] * TWC + offs_k[:, None]
    acc = tl.zeros((BM, NSP * 16), dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        xt = tl.load(x_ptrs + k, mask=row_ok[:, None], other=0.0)
        at = tl.load(a_ptrs + (k // TWC) * stride_a_kb + k % TWC, mask=col_ok[None, :], other=0.0)
        acc = tl.dot(xt, at.to(xt.dtype), acc, input_precision="tf32")
    scale = tl.load(scale_row + sl, mask=sl_ok, other=0.0)
    acc = acc * scale[None, :]
    s_ptrs = s_ptr + pid_k * stride_s_split + rows[:, None] * stride_s_t + sl[None, :] * stride_s_slice + j[None, :]
    tl.store(s_ptrs, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _expand_tiled(s_ptr, b_ptr, rank_ptr, idx_ptr, tiles_ptr, y_ptr, n_split, tile_cap, n_slices, nb, O1, O2, O3, O4,
                  stride_s_split, stride_s_t, stride_s_slice, stride_b_slot, stride_b_nb, stride_yt,
                  BM: tl.constexpr, BN: tl.constexpr, TWC: tl.constexpr):
    pid_tile = tl.program_id(0)
    pid_g = tl.program_id(1)
    slot = tl.load(tiles_ptr + pid_tile)
    if slot < 0:
        return
    lo = tl.load(tiles_ptr + tile_cap + pid_tile)
    hi = tl.load(tiles_ptr + 2 * tile_cap + pid_tile)
    slot64 = slot.to(tl.int64)
    gw = BN * nb
    g1 = tl.cdiv(O1, gw)
    g2 = g1 + tl.cdiv(O2 - O1, gw)
    g3 = g2 + tl.cdiv(O3 - O2, gw)
    sl = (pid_g >= g1).to(tl.int32) + (pid_g >= g2).to(tl.int32) + (pid_g >= g3).to(tl.int32)
    col_lo = tl.where(sl == 0, 0, tl.where(sl == 1, O1, tl.where(sl == 2, O2, O3)))
    col_hi = tl.where(sl == 0, O1, tl.where(sl == 1, O2, tl.where(sl == 2, O3, O4)))
    g_lo = tl.where(sl == 0, 0, tl.where(sl == 1, g1, tl.where(sl == 2, g2, g3)))
    r = tl.load(rank_ptr + slot64 * n_slices + sl)
    if r == 0:
        return
    m = tl.arange(0, BM)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)
    s_rows = s_ptr + rows[:, None] * stride_s_t + sl * stride_s_slice
    y_rows = y_ptr + rows[:, None] * stride_yt
    b_slot = b_ptr + slot64 * stride_b_slot
    n0 = col_lo + (pid_g - g_lo) * gw
    offs_r = tl.arange(0, 16)
    j_ok = offs_r < r
    sv = tl.zeros((BM, 16), dtype=tl.float32)
    for p in range(n_split):
        sv += tl.load(s_rows + p * stride_s_split + offs_r[None, :], mask=row_ok[:, None] & j_ok[None, :], other=0.0)
    CD = y_ptr.dtype.element_ty
    sv = sv.to(CD)
    for it in range(nb):
        cols = n0 + it * BN + tl.arange(0, BN)
        col_ok = cols < col_hi
        ok = row_ok[:, None] & col_ok[None, :]
        yv = tl.load(y_rows + cols[None, :], mask=ok, other=0.0)
        b_ptrs = b_slot + (cols[None, :] // TWC) * stride_b_nb + offs_r[:, None] * TWC + cols[None, :] % TWC
        bt = tl.load(b_ptrs, mask=j_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(sv, bt.to(CD), input_precision="tf32")
        tl.store(y_rows + cols[None, :], (yv.to(tl.float32) + acc).to(CD), mask=ok)


class Tiled:
    """The pool of one module copied into the tiled layout (same values)."""

    def __init__(self, w):
        L, S, R, K = w.a.shape
        out = w.b.shape[1]
        self.src = w
        self.a = w.a.reshape(L, S, R, K // TW, TW).permute(0, 1, 3, 2, 4).contiguous()  # [L, S, KB, R, TW]
        bt = w.b.transpose(1, 2)  # [L, R, out]
        self.b = bt.reshape(L, R, out // TW, TW).permute(0, 2, 1, 3).contiguous()  # [L, NB, R, TW]


def shrink_t(x, tw: Tiled, meta, s, sb):
    w = tw.src
    n_tiles = tile_grid(meta, sb.bm, x.shape[0], w.max_loras)
    kps = -(-w.in_features // (sb.split * sb.bk)) * sb.bk
    tiles = meta.tiles[tile_index(sb.bm)]
    nsp = triton.next_power_of_2(w.n_slices)
    _shrink_tiled[(n_tiles, 1, sb.split)](
        x, tw.a, w.rank, w.scale, meta.sorted_idx, tiles, s, w.in_features, kps, tiles.stride(0), w.n_slices,
        x.stride(0), tw.a.stride(0), tw.a.stride(1), tw.a.stride(2), s.stride(0), s.stride(1), s.stride(2),
        NSP=nsp, NSPM=max(nsp, 16), BM=sb.bm, BK=sb.bk, TWC=TW, num_warps=sb.num_warps, num_stages=sb.num_stages)


def expand_t(s, tw: Tiled, meta, y, eb):
    w = tw.src
    n_tiles = tile_grid(meta, eb.bm, y.shape[0], w.max_loras)
    offs = list(w.slice_offsets[1:-1]) + [w.out_features] * (4 - w.n_slices + 1)
    gw = eb.bn * eb.nb
    groups = sum(triton.cdiv(w.slice_offsets[i + 1] - w.slice_offsets[i], gw) for i in range(w.n_slices))
    tiles = meta.tiles[tile_index(eb.bm)]
    _expand_tiled[(n_tiles, groups)](
        s, tw.b, w.rank, meta.sorted_idx, tiles, y, s.shape[0], tiles.stride(0), w.n_slices, eb.nb, *offs,
        s.stride(0), s.stride(1), s.stride(2), tw.b.stride(0), tw.b.stride(1), y.stride(0),
        BM=eb.bm, BN=eb.bn, TWC=TW, num_warps=eb.num_warps, num_stages=eb.num_stages)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256,64,16;64,64,16;16,8,16;1024,64,16")
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    bw = bandwidth()
    pools = Pools(args.copies, 64, 64)
    tiled = {n: [Tiled(w) for w in ws] for n, ws in pools.w.items()}
    report = dict(device=props.name, copy_bandwidth_Bps=round(bw), torch=torch.__version__, triton=triton.__version__,
                  command=" ".join(["python3"] + sys.argv), points=[])
    for t, a, r in [tuple(ints(s)) for s in args.points.split(";") if s]:
        pools.set_rank(r)
        k = rotations_for(floor_bytes(t, min(t, a), r), l2)
        case = Case(pools, t, a, r, k)
        row = dict(tokens=t, adapters=a, rank=r, floor_us=round(floor_bytes(t, min(t, a), r) / bw * 1e6, 2), modules={})
        tot = {"old": 0.0, "tiled": 0.0}
        for n, (in_f, slices) in MODULES.items():
            sb = shrink_blocks(t, in_f, len(slices), 64, props.multi_processor_count)
            eb = expand_blocks(t, sum(slices), len(slices), 64, props.multi_processor_count)
            ss = [torch.empty((sb.split, t, len(slices), 64), device="cuda") for _ in range(k)]

            def run(i, kind, tiled_layout):
                rr = case.rot[i]
                w = pools.w[n][rr["copy"]]
                tw = tiled[n][rr["copy"]]
                if kind in ("shrink", "both"):
                    (shrink_t(rr["x"][n], tw, rr["meta"], ss[i], sb) if tiled_layout
                     else lora_shrink(rr["x"][n], w, rr["meta"], ss[i], sb))
                if kind in ("expand", "both"):
                    (expand_t(ss[i], tw, rr["meta"], rr["y"][n], eb) if tiled_layout
                     else lora_expand(ss[i], w, rr["meta"], rr["y"][n], eb))

            y0 = case.rot[0]["y"][n].clone()
            run(0, "both", False)
            y_old = case.rot[0]["y"][n].clone()
            case.rot[0]["y"][n].copy_(y0)
            run(0, "both", True)
            same = torch.equal(case.rot[0]["y"][n], y_old)
            m = dict(bit_identical=same)
            for kind in ("shrink", "expand", "both"):
                for lay in (False, True):
                    us = min(graph_time_us(lambda i: run(i, kind, lay), k) for _ in range(2))
                    m[f"{kind}_{'tiled' if lay else 'old'}"] = round(us, 2)
            tot["old"] += m["both_old"]
            tot["tiled"] += m["both_tiled"]
            row["modules"][n] = m
        row["layer_old_us"], row["layer_tiled_us"] = round(tot["old"], 2), round(tot["tiled"], 2)
        print(json.dumps(row), flush=True)
        report["points"].append(row)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        del case
    print(f"done in {time.time() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
