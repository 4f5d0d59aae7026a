"""Probe for the next expand design: tiles that pack several short segments (adapters) into one 16-row tile.

    PYTHONPATH=. python3 benchmarks/probe_packed_expand.py --out $OUT/probe-packed-expand.json

At 256 tokens / 64 adapters every segment has 4 tokens, so each 16-row expand tile carries 4 real rows: 4x the
CTAs, and the y tile's loads, conversions and stores are issued for 16 rows to move 4. Nsight (RESULTS.md,
session 12) shows the expands bound by per-CTA instruction and latency cost over several waves, not by bytes.
A packed tile takes up to NSEG consecutive segments (<= 16 rows together) and contracts over NSEG x R: s is
placed in its row's segment block of a [BM, NSEG * R] operand (zeros elsewhere) and the NSEG adapters' B tiles
are stacked into [NSEG * R, BN], so one dot computes every row's own delta. B bytes are unchanged (each adapter's
B once per column block), x / y bytes unchanged; CTAs / NSEG.

Prototype only (not wired into add_lora): one rank-16 slice per launch (o, down, and "wide": one 14336-column
slice, gate_up's width), tiles built on the host, no PDL. Timed
against the current `lora_expand` on the same s, B and y (its partial-sum count included), in CUDA graphs of K
rotations as bench_kernels.py does, with PDL off for both and on for the current one; outputs checked close.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl

from bench_kernels import Case, Pools, device_report, graph_time_us, rotations_for, save_report
from multilora_cli.kernels import LoraWeights, pdl
from multilora_cli.kernels.blocks import expand_blocks, shrink_blocks
from multilora_cli.kernels.sgmv_expand import lora_expand


@triton.jit
def _packed_expand(
    s_ptr,
    b_ptr,
    rank_ptr,
    idx_ptr,
    slot_ptr,
    tiles_ptr,
    y_ptr,
    n_split,
    N,
    tile_cap,
    stride_s_split,
    stride_s_t,
    stride_b_slot,
    stride_b_rank,
    stride_yt,
    BM: tl.constexpr,
    BN: tl.constexpr,
    R: tl.constexpr,
    NSEG: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    lo = tl.load(tiles_ptr + pid_t)
    hi = tl.load(tiles_ptr + tile_cap + pid_t)
    m = tl.arange(0, BM)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
    slots = tl.load(slot_ptr + lo + m, mask=row_ok, other=-1)  # [BM] slot of each sorted row
    prev = tl.load(slot_ptr + lo + m - 1, mask=row_ok & (m > 0), other=-1)
    seg = tl.cumsum(((slots != prev) & (m > 0)).to(tl.int32), 0)  # [BM] segment index within the tile
    kk = tl.arange(0, NSEG * R)
    kseg = kk // R
    kr = kk % R
    hit = (seg[:, None] == kseg[None, :]) & row_ok[:, None]  # [BM, NSEG*R]
    seg_slot = tl.max(tl.where(hit, slots[:, None], -1), axis=0)  # [NSEG*R] slot of column kk's segment
    r = tl.load(rank_ptr + seg_slot, mask=seg_slot >= 0, other=0)
    k_ok = (seg_slot >= 0) & (kr < r)
    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < N
    ok = row_ok[:, None] & col_ok[None, :]
    b = tl.load(
        b_ptr + seg_slot.to(tl.int64)[:, None] * stride_b_slot + kr[:, None] * stride_b_rank + cols[None, :],
        mask=k_ok[:, None] & col_ok[None, :],
        other=0.0,
    )  # [NSEG*R, BN] the tile's adapters stacked
    y_ptrs = y_ptr + rows[:, None] * stride_yt + cols[None, :]
    yv = tl.load(y_ptrs, mask=ok, other=0.0)
    s_ptrs = s_ptr + rows[:, None] * stride_s_t + kr[None, :]
    s_ok = hit & (kr < R)[None, :]
    sv = tl.zeros((BM, NSEG * R), dtype=tl.float32)
    for p in range(n_split):
        sv += tl.load(s_ptrs + p * stride_s_split, mask=s_ok, other=0.0)
    acc = tl.dot(sv.to(y_ptr.dtype.element_ty), b)
    tl.store(y_ptrs, (yv.to(tl.float32) + acc).to(y_ptr.dtype.element_ty), mask=ok)


def packed_tiles(case: Case, k: int, bm: int, nseg: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted token ids, slot per sorted row, tiles [2, cap] = lo / hi) for rotation k, packing consecutive
    segments while they fit in bm rows and nseg segments; a segment longer than bm takes tiles of its own."""
    idx = case.rot[k]["idx"]
    order, slot_of, tiles = [], [], []
    cur_lo, cur_rows, cur_segs = 0, 0, 0
    for slot in sorted(idx):
        ids = idx[slot].tolist()
        start = len(order)
        order += ids
        slot_of += [slot] * len(ids)
        n = len(ids)
        if n > bm:  # close the open tile, then whole tiles of this segment
            if cur_rows:
                tiles.append((cur_lo, cur_lo + cur_rows))
            for a in range(start, start + n, bm):
                tiles.append((a, min(a + bm, start + n)))
            cur_lo, cur_rows, cur_segs = len(order), 0, 0
            continue
        if cur_rows + n > bm or cur_segs == nseg:
            tiles.append((cur_lo, cur_lo + cur_rows))
            cur_lo, cur_rows, cur_segs = start, 0, 0
        cur_rows += n
        cur_segs += 1
    if cur_rows:
        tiles.append((cur_lo, cur_lo + cur_rows))
    t = torch.tensor(tiles, dtype=torch.int32).T.contiguous()
    return (
        torch.tensor(order, dtype=torch.int32, device=device),
        torch.tensor(slot_of, dtype=torch.int32, device=device),
        t.to(device),
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256,64;256,16;128,32;64,64")
    p.add_argument("--modules", default="o,down,wide")
    p.add_argument("--nseg", default="2,4")
    p.add_argument("--bn", default="128,256")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(rows=[])
    pools = Pools(4, 64, 16)
    pools.set_rank(16)
    for point in args.points.split(";"):
        t, a = (int(v) for v in point.split(","))
        k = rotations_for(64 << 20, l2)
        case = Case(pools, t, a, 16, k)
        for module in args.modules.split(","):
            in_f, slices = {"o": (4096, [4096]), "down": (14336, [4096]), "wide": (4096, [14336])}[module]
            n = slices[0]
            if module not in pools.w:  # one gate_up-wide slice (the prototype handles one slice per launch)
                pools.w[module] = [LoraWeights.empty(64, 16, in_f, slices, torch.bfloat16, "cuda") for _ in range(4)]
                for w in pools.w[module]:
                    w.b.normal_(0, 0.1)
                    w.rank.fill_(16)
                    w.scale.fill_(2.0)
            for r in case.rot:
                r["y"].setdefault(module, torch.randn(t, n, device="cuda", dtype=torch.bfloat16))
            sb = shrink_blocks(t, in_f, len(slices), 16, 132)
            eb = expand_blocks(t, sum(slices), len(slices), 16, 132)
            ss = [torch.randn((sb.split, t, len(slices), 16), device="cuda") for _ in range(k)]
            ws = [pools.w[module][case.rot[i]["copy"]] for i in range(k)]
            packs = {}
            for nseg in (int(v) for v in args.nseg.split(",")):
                packs[nseg] = [packed_tiles(case, i, 16, nseg, "cuda") for i in range(k)]

            def current(i):
                lora_expand(ss[i], ws[i], case.rot[i]["meta"], case.rot[i]["y"][module], eb)

            def packed(nseg, bn):
                def fn(i):
                    order, slot_of, tiles = packs[nseg][i]
                    w = ws[i]
                    _packed_expand[(triton.cdiv(n, bn), tiles.shape[1])](
                        ss[i],
                        w.b,
                        w.rank,
                        order,
                        slot_of,
                        tiles,
                        case.rot[i]["y"][module],
                        sb.split,
                        n,
                        tiles.stride(0),
                        ss[i].stride(0),
                        ss[i].stride(1),
                        w.b.stride(0),
                        w.b.stride(2),
                        case.rot[i]["y"][module].stride(0),
                        BM=16,
                        BN=bn,
                        R=16,
                        NSEG=nseg,
                        num_warps=4,
                    )

                return fn

            # correctness on rotation 0: the packed result vs the current one
            y0 = case.rot[0]["y"][module].clone()
            current(0)
            want = case.rot[0]["y"][module].clone()
            case.rot[0]["y"][module].copy_(y0)
            packed(max(packs), 128)(0)
            got = case.rot[0]["y"][module].clone()
            case.rot[0]["y"][module].copy_(y0)
            err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            times = {}
            for name_rep in range(args.repeats):
                for mode, fn in [("current pdl", current), ("current no-pdl", current)] + [
                    (f"packed nseg{s} bn{b}", packed(s, b)) for s in packs for b in (int(v) for v in args.bn.split(","))
                ]:
                    pdl.force(pdl.OFF if "no-pdl" in mode or mode.startswith("packed") else None)
                    times.setdefault(mode, []).append(graph_time_us(fn, k, rep_ms=30))
            pdl.force(None)
            row = dict(
                tokens=t,
                adapters=a,
                module=module,
                columns=n,
                max_rel_err=err,
                tiles_current=case.rot[0]["meta"].tile_counts[0],
                tiles_packed={s: int(packs[s][0][2].shape[1]) for s in packs},
                **{m: round(min(v), 2) for m, v in times.items()},
            )
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
        del case
        save_report(report, args.out, start)
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
