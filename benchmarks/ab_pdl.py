"""A/B of programmatic dependent launch for the SGMV kernels, in one process (kernels/pdl.py).

    PYTHONPATH=. python3 benchmarks/ab_pdl.py --out benchmarks/results/kernels-pdl-<device>.json

Same timing as bench_kernels.py (median of CUDA-graph replays of K rotations of one Llama-3-8B layer, L2
cleared between replays, floor = bytes / copy bandwidth measured in this run). Modes are interleaved per point
and repeated, so device drift hits every mode alike: off, PDL, PDL + L2 prefetch of the CTA's weight lines; then
the table's PDL mode with the real tile count instead of the graph's static bound. (Run 4 also timed tiles on
the fastest grid axis, the layout before session 4, under which a static grid's padding CTAs interleave.)
(Runs 1-2 of kernels-pdl-h200 also timed an earlier trigger of the next launch: at the CTA's start.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench_kernels import Case, Pools, device_report, floor_bytes, graph_time_us, module_times, rotations_for
from multilora_cli.kernels import pdl, sgmv_expand, sgmv_shrink
from multilora_cli.kernels.blocks import tile_index

MODES = {"off": pdl.OFF, "pdl": pdl.PdlMode(launch=True), "pdl+prefetch": pdl.PdlMode(launch=True, prefetch=True)}


class ExactGrid:
    """Launch the real tile count under capture instead of the static bound (valid here only because every
    replay reuses the captured mix): what the padding CTAs of a decode graph's static grid cost."""

    def __enter__(self):
        self.saved = sgmv_shrink.tile_grid, sgmv_expand.tile_grid
        exact = lambda meta, bm, t, max_loras: meta.tile_counts[tile_index(bm)]  # noqa: E731
        sgmv_shrink.tile_grid = sgmv_expand.tile_grid = exact

    def __exit__(self, *exc):
        sgmv_shrink.tile_grid, sgmv_expand.tile_grid = self.saved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--points",
        default="256,64,16;256,16,16;64,64,16;16,8,16;1,1,16;1024,64,16;4096,64,16",
        help="tokens,adapters,rank;...",
    )
    p.add_argument("--pool-rank", type=int, default=16, help="max_rank of the pool (the engine sizes it so)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    l2, bw, report = device_report(pool_rank=args.pool_rank, rows=[], modules=[])
    pools = Pools(4, 64, args.pool_rank)
    for point in args.points.split(";"):
        t, a, r = (int(v) for v in point.split(","))
        pools.set_rank(r)
        fb = floor_bytes(t, min(t, a), r)
        k = rotations_for(fb, l2)
        case = Case(pools, t, a, r, k)
        times = {m: [] for m in [*MODES, "pdl-exact-grid"]}
        for _ in range(args.repeats):
            for name, mode in MODES.items():
                pdl.force(mode)
                times[name].append(graph_time_us(case.ours, k))
            pdl.force(pdl.table_mode(t))
            with ExactGrid():
                times["pdl-exact-grid"].append(graph_time_us(case.ours, k))
        floor_us = fb / bw * 1e6
        row = dict(
            tokens=t,
            adapters=a,
            rank=r,
            floor_us=round(floor_us, 2),
            **{f"{m}_us": round(min(v), 2) for m, v in times.items()},
            **{f"{m}_all": [round(x, 2) for x in v] for m, v in times.items()},
        )
        row.update({f"{m}_over_floor": round(min(v) / floor_us, 3) for m, v in times.items()})
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        if (t, a, r) == (256, 64, 16):  # where the time goes at the target, per module and mode
            report["modules"] = module_times(
                pools, t, a, r, l2, {name: (lambda mode=mode: pdl.force(mode)) for name, mode in MODES.items()}
            )
        del case
    pdl.force(None)
    report["elapsed_s"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
