"""Why rank-16 adapters run slower in a rank-64 slot pool than in a rank-16 one, although they move the same bytes.

    PYTHONPATH=. python3 benchmarks/probe_pool_rank.py --out $OUT/probe-pool-rank.json

Session 5 measured 105.5 us vs 89.2 us per Llama-3-8B layer at 256 tokens / 64 adapters. The kernels compile the
rank-32 and rank-64 branches beside the rank-16 one when the pool's max_rank allows them, and a kernel's register
and shared-memory allocation is the largest over its branches, so the hypothesis is lower occupancy for every CTA.

Two parts, one process:
1. Resources: every kernel variant a layer launches (shrink, expand, fused SiLU expand) compiled per pool rank,
   with its registers per thread, spills and shared memory (the compiled kernel's metadata).
2. Timing (as bench_kernels.py: median of CUDA-graph replays of K rotations, L2 cleared between replays): the
   layer (add_lora on qkv, o, gate_up, down), the engine's gate_up (shrink + fused SiLU expand), and each kernel
   alone, for rank-16 adapters in pools of max_rank 16 / 32 / 64, plus arms that cap the registers of the
   pool-64 kernels (Triton's `maxnreg`), also timed on rank-64 adapters (what a cap costs the large branch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench_kernels import MODULES, Case, Pools, device_report, floor_bytes, graph_time_us, rotations_for, save_report
from multilora_cli.kernels import launch as launch_mod
from multilora_cli.kernels import sgmv, sgmv_expand, sgmv_shrink, sgmv_silu
from multilora_cli.kernels.blocks import expand_blocks, shrink_blocks

KERNEL_MODULES = {"shrink": sgmv_shrink, "expand": sgmv_expand, "silu": sgmv_silu}
_launch = launch_mod.launch
CAPS: dict[str, int | None] = {}  # kernel kind -> maxnreg of the current arm


def _capped(kind: str):
    def launch(kernel, grid, *args, **kwargs):
        if CAPS.get(kind) is not None and "maxnreg" not in kwargs:
            kwargs["maxnreg"] = CAPS[kind]
        _launch(kernel, grid, *args, **kwargs)

    return launch


for _kind, _mod in KERNEL_MODULES.items():
    _mod.launch = _capped(_kind)


def kind_of(kernel) -> str:
    name = getattr(kernel, "__name__", "") or getattr(getattr(kernel, "fn", None), "__name__", "")
    return "shrink" if "shrink" in name else "silu" if "silu" in name else "expand"


def resources(case: Case, pools: Pools) -> list[dict]:
    """Registers / spills / shared memory of every kernel variant one layer (+ the SiLU path) launches."""
    r = case.rot[0]
    with launch_mod.collect() as calls:
        case.ours(0)
        sgmv.add_lora_silu_mul_triton(r["y"]["gate_up"], r["x"]["gate_up"], pools.w["gate_up"][r["copy"]], r["meta"])
    rows = []
    names = [n for n in MODULES] + ["gate_up"]
    for i, (kernel, args, kwargs) in enumerate(calls):
        kind = kind_of(kernel)
        if CAPS.get(kind) is not None:
            kwargs = dict(kwargs, maxnreg=CAPS[kind])
        ck = kernel.warmup(*args, grid=(1,), **kwargs)
        if hasattr(ck, "_init_handles"):
            ck._init_handles()
        rows.append(
            dict(
                kernel=kind,
                module=names[min(i // 2, len(names) - 1)],
                regs=getattr(ck, "n_regs", None),
                spills=getattr(ck, "n_spills", None),
                shared=getattr(ck.metadata, "shared", None),
                warps=kwargs.get("num_warps"),
            )
        )
    return rows


def kernel_fns(case: Case, pools: Pools, module: str):
    """shrink alone and expand alone (over the table shrink's real partial count, random) for one module."""
    in_f, slices = MODULES[module]
    t = case.t
    sb = shrink_blocks(t, in_f, len(slices), pools.pool_rank, 132)
    eb = expand_blocks(t, sum(slices), len(slices), pools.pool_rank, 132)
    s = [torch.randn((sb.split, t, len(slices), pools.pool_rank), device="cuda") for _ in case.rot]

    def shrink(i):
        r = case.rot[i]
        sgmv.lora_shrink(r["x"][module], pools.w[module][r["copy"]], r["meta"], s[i], sb)

    def expand(i):
        r = case.rot[i]
        sgmv.lora_expand(s[i], pools.w[module][r["copy"]], r["meta"], r["y"][module], eb)

    return shrink, expand


def time_point(pools: Pools, t: int, a: int, rank: int, l2: int, per_kernel: bool) -> dict:
    k = rotations_for(floor_bytes(t, min(t, a), rank), l2)
    case = Case(pools, t, a, rank, k)

    def silu(i):
        r = case.rot[i]
        sgmv.add_lora_silu_mul_triton(r["y"]["gate_up"], r["x"]["gate_up"], pools.w["gate_up"][r["copy"]], r["meta"])

    out = dict(layer_us=graph_time_us(case.ours, k), gate_up_silu_us=graph_time_us(silu, k))
    if per_kernel:
        for n in MODULES:
            shrink, expand = kernel_fns(case, pools, n)
            out[f"{n}_shrink_us"] = graph_time_us(shrink, k, rep_ms=30)
            out[f"{n}_expand_us"] = graph_time_us(expand, k, rep_ms=30)
    out = {key: round(v, 2) for key, v in out.items()}
    out["resources"] = resources(case, pools) if t == 256 else []
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256,64;256,16;64,64;16,8;1,1")
    p.add_argument("--caps", default="128,96,80,64", help="maxnreg values for the capped pool-64 arms")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(rows=[])
    pools = {pr: Pools(4, 64, pr) for pr in (16, 32, 64)}
    arms = [("pool16", 16, {}), ("pool32", 32, {}), ("pool64", 64, {})]
    for cap in (int(c) for c in args.caps.split(",") if c):
        arms.append((f"pool64 cap{cap}", 64, dict(shrink=cap, expand=cap, silu=cap)))
        arms.append((f"pool64 expand-cap{cap}", 64, dict(expand=cap, silu=cap)))
    for point in args.points.split(";"):
        t, a = (int(v) for v in point.split(","))
        for rank in (16, 64):
            for rep in range(args.repeats):
                for name, pr, caps in arms:
                    if rank > pr:
                        continue
                    CAPS.clear()
                    CAPS.update(caps)
                    pools[pr].set_rank(rank)
                    row = dict(
                        tokens=t,
                        adapters=a,
                        rank=rank,
                        arm=name,
                        repeat=rep,
                        floor_us=round(floor_bytes(t, min(t, a), rank) / bw * 1e6, 2),
                        **time_point(pools[pr], t, a, rank, l2, per_kernel=(t == 256 and not caps)),
                    )
                    if rep:
                        row.pop("resources")
                    report["rows"].append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "resources"}), flush=True)
                    for res in row.get("resources", []):
                        print("  ", json.dumps(res), flush=True)
        save_report(report, args.out, start)
    CAPS.clear()
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
