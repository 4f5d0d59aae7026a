"""The base model's decode matmuls alone: how far from the compute and bytes floors is cuBLAS at decode batch
sizes, and does the weight layout change that?

    python -m benchmarks.bench_gemm --out $OUT/gemm-h200.json

Llama-3-8B projections (qkv, o, gate_up, down, LM head), bf16, M = decode tokens. Arms, interleaved and repeated
(min of medians): "linear" = F.linear(x, W) with W [out, in] (what `PackedLinear` runs); "xwt" = x @ Wt with
the weight stored transposed, Wt [in, out] contiguous (cuBLAS picks other kernels for the NN layout). Each
timing is the median of CUDA-graph replays over 3 copies of the weight (each >= 32 MB, so a copy is not in
L2 when its turn comes). Floors: FLOPs / the bf16 rate of an 8192^3 matmul and bytes (W + x + y) / copy
bandwidth, both measured in this run; per decode step = 32 layers + the LM head.

    python -m benchmarks.bench_gemm --fp8 --out $OUT/gemm-fp8-h200.json

FP8 (issue 32): per token count M and projection (qkv, o, gate_up, down; the LM head stays bf16), arms
"bf16" = F.linear on the bf16 weight, "scaled_mm" = kernels/fp8.linear taking cuBLAS (per-token activation
quantization + torch._scaled_mm, row-wise scales), "triton" = kernels/fp8.linear taking the Triton kernel
(quantization + fp8_mm.weight_dequant_mm), "w8a16" = the Triton kernel on the bf16 activations (weight-only). Each
row also carries each FP8 arm's relative error ||y - y_bf16|| / ||y_bf16|| against the bf16 layer. Per M, one
layer's four GEMMs summed; `fp8_small_m` = the smallest M from which scaled_mm beats triton at every larger M
measured: the value for EngineConfig.fp8_small_m (config.FP8_SMALL_M).

    python -m benchmarks.bench_gemm --fp8 --sweep --out $OUT/gemm-fp8-sweep-h200.json

The Triton kernel's launch configurations (BLOCK_N, BLOCK_K, SPLIT_K) per projection and M, each timed like the
arms above, with `pick_config`'s choice and the best found: what kernels/fp8_mm.pick_config is fitted to.
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


FP8_TOKENS = "1,2,4,8,16,24,32,48,64,96,128,256,1024,8192"
FP8_ARMS = ("bf16", "scaled_mm", "triton", "w8a16")


def fp8_main(args) -> int:
    from multilora_cli.kernels import fp8
    from multilora_cli.kernels.fp8 import Fp8Scheme
    from multilora_cli.kernels.fp8_mm import weight_dequant_mm

    start = time.time()
    bw = copy_bandwidth()
    report = dict(**device_header("benchmarks.bench_gemm", bw), fp8=True, rows=[], layers=[])
    cublas, triton_ = Fp8Scheme("dynamic", small_m=0), Fp8Scheme("dynamic", small_m=1 << 30)
    tokens = ints(args.tokens if args.tokens != "64,128,256,512" else FP8_TOKENS)
    for name, (k, n) in SHAPES.items():
        if name == "lm_head":
            continue
        w = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(COPIES)]
        q = [fp8.quantize_rows(x) for x in w]  # (wq [n, k] e4m3, scale [n] fp32)
        for m in tokens:
            x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
            arms = {
                "bf16": lambda i, x=x, w=w: F.linear(x[i], w[i]),
                "scaled_mm": lambda i, x=x, q=q: fp8.linear(x[i], *q[i], None, cublas),
                "triton": lambda i, x=x, q=q: fp8.linear(x[i], *q[i], None, triton_),
                "w8a16": lambda i, x=x, q=q: weight_dequant_mm(x[i], *q[i], None, None, out_dtype=torch.bfloat16),
            }
            ref = arms["bf16"](0).float()
            err = {a: ((arms[a](0).float() - ref).norm() / ref.norm()).item() for a in FP8_ARMS[1:]}
            timers = {a: lambda fn=fn: graph_time_us(fn, COPIES, 60) for a, fn in arms.items()}
            best = interleaved_min(timers, args.repeats)
            row = dict(module=name, tokens=m, **{f"{a}_us": round(v, 2) for a, v in best.items()})
            row.update({f"{a}_rel_err": round(v, 5) for a, v in err.items()})
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
        del w, q
    for m in tokens:
        rows = [r for r in report["rows"] if r["tokens"] == m]
        layer = {f"{a}_us": round(sum(r[f"{a}_us"] for r in rows), 2) for a in FP8_ARMS}
        layer["fp8_vs_bf16"] = round(layer["bf16_us"] / min(layer["scaled_mm_us"], layer["triton_us"]), 3)
        report["layers"].append(dict(tokens=m, **layer))
        print(json.dumps(report["layers"][-1]), flush=True)
    small_m = tokens[-1] + 1
    for lay in reversed(report["layers"]):  # from the largest M down, while cuBLAS keeps winning
        if lay["scaled_mm_us"] > lay["triton_us"]:
            break
        small_m = lay["tokens"]
    report["fp8_small_m"] = small_m
    print(json.dumps({"fp8_small_m": small_m}), flush=True)
    save_report(report, args.out, start)
    return 0


SWEEP = [
    (bn, bk, sk, w, st)
    for bn in (64, 128, 256)
    for bk in (128, 256)
    for sk in (2, 4, 8, 16)
    for w, st in ((4, 3), (4, 4), (8, 3))
]


def fp8_sweep(args) -> int:
    from triton.runtime.errors import OutOfResources

    from multilora_cli.kernels import fp8
    from multilora_cli.kernels.fp8_mm import pick_config, weight_dequant_mm

    start = time.time()
    report = dict(**device_header("benchmarks.bench_gemm", copy_bandwidth()), fp8_sweep=True, rows=[])
    for name, (k, n) in SHAPES.items():
        if name == "lm_head":
            continue
        q = [fp8.quantize_rows(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5) for _ in range(COPIES)]
        for m in ints(args.tokens if args.tokens != "64,128,256,512" else "1,4,16,32"):
            xq = [
                fp8.quantize_activations(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), fp8.Fp8Scheme(), None)
                for _ in range(COPIES)
            ]
            times = {}
            for cfg in SWEEP:
                if cfg[1] * cfg[2] > k:
                    continue

                def fn(i, c=cfg):
                    return weight_dequant_mm(*xq[i][:1], *q[i], xq[i][1], None, out_dtype=torch.bfloat16, config=c)

                try:
                    times[cfg] = graph_time_us(fn, COPIES, 30)
                except OutOfResources as e:  # shared memory of a large tile at many stages
                    print(f"skip {cfg}: {type(e).__name__}", flush=True)
            best = min(times, key=times.get)
            picked = pick_config(m, n, k)
            row = dict(
                module=name,
                tokens=m,
                best=list(best),
                best_us=round(times[best], 2),
                picked=list(picked),
                picked_us=round(times.get(picked, float("nan")), 2),
                all={"/".join(map(str, c)): round(t, 2) for c, t in times.items()},
            )
            report["rows"].append(row)
            print(json.dumps({k2: v for k2, v in row.items() if k2 != "all"}), flush=True)
    save_report(report, args.out, start)
    return 0


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--tokens", default="64,128,256,512")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--fp8", action="store_true", help="bf16 vs FP8 (cuBLAS _scaled_mm, Triton) per token count")
    p.add_argument("--sweep", action="store_true", help="with --fp8: the Triton kernel's launch configurations")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.fp8 and args.sweep:
        return fp8_sweep(args)
    if args.fp8:
        return fp8_main(args)
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
