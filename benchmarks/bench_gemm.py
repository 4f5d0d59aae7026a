"""The base model's decode matmuls alone: how far from the compute and bytes floors is cuBLAS at decode batch
sizes, and does the weight layout change that?

    python -m benchmarks.bench_gemm --out $OUT/gemm-h200.json

Llama-3-8B projections (qkv, o, gate_up, down, LM head), bf16, M = decode tokens. Arms, interleaved and repeated
(min of medians): "linear" = F.linear(x, W) with W [out, in] (what `PackedLinear` runs); "xwt" = x @ Wt with
the weight stored transposed, Wt [in, out] contiguous (cuBLAS picks other kernels for the NN layout). Each
timing is the median of CUDA-graph replays over 3 copies of the weight (each >= 32 MB, so a copy is not in
L2 when its turn comes). Floors: FLOPs / the bf16 rate of an 8192^3 matmul and bytes (W + x + y) / copy
bandwidth, both measured in this run; per decode step = 32 layers + the LM head.
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F

from benchmarks.timing import (
    copy_bandwidth,
    device_header,
    graph_time_us,
    interleaved_min,
    ints,
    matmul_rate,
    parser,
    save_report,
)

SHAPES = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
    "lm_head": (4096, 128256),
}  # name -> (in, out)
LAYERS = 32
COPIES = 3


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--tokens", default="64,128,256,512")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    bw, flops = copy_bandwidth(), matmul_rate()
    report = dict(**device_header("benchmarks.bench_gemm", bw), matmul_flops=round(flops), rows=[], steps=[])
    print(f"{report['device']}: copy {bw / 1e12:.2f} TB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s", flush=True)
    for name, (k, n) in SHAPES.items():
        w = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(COPIES)]
        wt = [x.t().contiguous() for x in w]
        for m in ints(args.tokens):
            x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
            arms = {"linear": lambda i, x=x, w=w: F.linear(x[i], w[i]), "xwt": lambda i, x=x, wt=wt: x[i] @ wt[i]}
            same = torch.allclose(arms["linear"](0).float(), arms["xwt"](0).float(), rtol=2e-2, atol=2e-2)
            timers = {a: lambda fn=fn: graph_time_us(fn, COPIES, 60) for a, fn in arms.items()}
            best = interleaved_min(timers, args.repeats)
            fl, by = 2 * m * k * n, (k * n + m * k + m * n) * 2
            row = dict(
                module=name,
                tokens=m,
                close=same,
                compute_floor_us=round(fl / flops * 1e6, 2),
                bytes_floor_us=round(by / bw * 1e6, 2),
                **{f"{a}_us": round(v, 2) for a, v in best.items()},
            )
            row["linear_tflops"] = round(fl / row["linear_us"] / 1e6, 1)
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
        del w, wt
    for m in ints(args.tokens):
        rows = {r["module"]: r for r in report["rows"] if r["tokens"] == m}
        step = {}
        for key in ("linear_us", "xwt_us", "compute_floor_us", "bytes_floor_us"):
            layer = sum(rows[n][key] for n in SHAPES if n != "lm_head")
            step[key.replace("_us", "_ms")] = round((LAYERS * layer + rows["lm_head"][key]) / 1e3, 3)
        step["best_of_both_ms"] = round(
            (
                LAYERS * sum(min(rows[n]["linear_us"], rows[n]["xwt_us"]) for n in SHAPES if n != "lm_head")
                + min(rows["lm_head"]["linear_us"], rows["lm_head"]["xwt_us"])
            )
            / 1e3,
            3,
        )
        report["steps"].append(dict(tokens=m, **step))
        print(json.dumps(report["steps"][-1]), flush=True)
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
