"""One eager pass of the SGMV kernels over a Llama-3-8B layer, bracketed for Nsight Compute.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 benchmarks/ncu_sgmv.py --point 256,64,16

Warms up (compiles) outside the profiled range, then runs shrink + expand of every module once inside
cudaProfilerStart/Stop, so ncu reports exactly 8 kernels (L2 flushed before each by ncu's default).
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench_kernels import MODULES, Case, Pools, ints
from multilora_cli.kernels import add_lora


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", default="256,64,16", help="tokens,adapters,rank")
    args = ap.parse_args()
    t, a, r = ints(args.point)
    pools = Pools(1, 64, 64)
    pools.set_rank(r)
    case = Case(pools, t, a, r, 1)
    rot = case.rot[0]

    def layer():
        for n in MODULES:
            add_lora(rot["y"][n], rot["x"][n], pools.w[n][0], rot["meta"])

    for _ in range(3):
        layer()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    layer()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
