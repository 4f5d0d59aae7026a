"""One sparse MoE layer at Qwen3-30B-A3B shapes: the grouped torch path (kernels/moe_reference.py) against the fused
MoE Triton kernels (kernels/fused_moe.py), without and with expert LoRA.

    python -m benchmarks.bench_moe --out $OUT/moe-h200.json
    python -m benchmarks.bench_moe --tokens 1,64,256,2048 --adapters 64 --rank 16

Shapes: hidden 2048, 128 experts, top-8, expert intermediate 768, bf16. For each T (tokens in the step, e.g. a
decode batch) five arms, interleaved (min of medians): "base" and "lora" through the grouped path (eager
launches: it syncs once per call), "fused_base" and "fused_lora" through the fused kernels (replayed from a CUDA
graph, as decode steps run them), where lora = T tokens spread round-robin over `--adapters` slots, rank `--rank`,
every slot adapting gate_up and down; and the floor "bytes": the distinct experts' weights the step touches (and,
for lora, the distinct (expert, adapter) LoRA factors) read once at the measured copy bandwidth. Per decode step
of the whole model: x 48 layers. Reads: time_us per arm; fused_lora / fused_base (what expert LoRA costs),
base / fused_base (the fused kernels' speed-up), fused_base / floor (distance to the roofline); rel_err: the
fused output against the grouped one (bf16 rounding, ~1e-3).
"""

from __future__ import annotations

import time

import torch

from benchmarks.timing import (
    copy_bandwidth,
    device_header,
    eager_time_us,
    graph_time_us,
    interleaved_min,
    ints,
    parser,
    save_report,
)

H, E, K, INTER, LAYERS = 2048, 128, 8, 768, 48


def main(argv: list[str] | None = None) -> int:
    from multilora_cli.kernels.expert_weights import ExpertLoraWeights
    from multilora_cli.kernels.fused_moe import fused_moe
    from multilora_cli.kernels.moe_reference import moe_reference, route

    ap = parser(__doc__)
    ap.add_argument("--tokens", default="1,16,64,256,1024")
    ap.add_argument("--adapters", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16, help="LoRA slots allocated (each is E x rank per layer)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/moe.json")
    args = ap.parse_args(argv)
    dev, dt = "cuda", torch.bfloat16
    start = time.time()
    torch.manual_seed(0)
    gate_up = torch.randn(E, 2 * INTER, H, device=dev, dtype=dt) * 0.02
    down = torch.randn(E, H, INTER, device=dev, dtype=dt) * 0.02
    router = torch.randn(E, H, device=dev, dtype=dt) * 0.02
    slots = min(args.slots, args.adapters)
    lora = ExpertLoraWeights.empty(slots, args.rank, E, H, INTER, dt, dev)
    for t in (lora.gu_a, lora.gu_b, lora.dn_a, lora.dn_b):
        t.normal_(0, 0.02)
    # gu_b is block-diagonal in a slot (kernels/expert_weights.py): gate rows read the gate ranks, up rows the up ranks
    lora.gu_b[:, :, :INTER, args.rank :] = 0
    lora.gu_b[:, :, INTER:, : args.rank] = 0
    lora.gu_scale.fill_(2.0)
    lora.dn_scale.fill_(2.0)
    lora.rank.fill_(args.rank)
    bw = copy_bandwidth()
    report = {**device_header("benchmarks.bench_moe", bw), "shapes": dict(H=H, E=E, K=K, I=INTER), "rows": []}
    expert_bytes = (2 * INTER * H + H * INTER) * 2
    # A of gate, up, down and B of gate, up, down (the slots store gate_up B block-diagonal; read: its blocks)
    lora_bytes = (2 * args.rank * H + 2 * INTER * args.rank + args.rank * INTER + H * args.rank) * 2
    for T in ints(args.tokens):
        x = torch.randn(T, H, device=dev, dtype=dt)
        w, idx = route(x @ router.T, K, "qwen", True)
        slot = (torch.arange(T, device=dev) % slots).to(torch.int64)
        timers = {
            "base": lambda: eager_time_us(lambda _: moe_reference(x, w, idx, gate_up, down), 1),
            "lora": lambda: eager_time_us(lambda _: moe_reference(x, w, idx, gate_up, down, slot, lora), 1),
            "fused_base": lambda: graph_time_us(lambda _: fused_moe(x, w, idx, gate_up, down), 1),
            "fused_lora": lambda: graph_time_us(lambda _: fused_moe(x, w, idx, gate_up, down, slot, lora), 1),
        }
        err = {}
        for arm, args_ in (("base", ()), ("lora", (slot, lora))):
            ref = moe_reference(x, w, idx, gate_up, down, *args_).double()
            err[arm] = ((fused_moe(x, w, idx, gate_up, down, *args_).double() - ref).norm() / ref.norm()).item()
        best = interleaved_min(timers, args.repeats)
        distinct = int(idx.unique().numel())
        pairs = int((idx * slots + slot[:, None]).unique().numel())
        floor = {
            "base": distinct * expert_bytes / bw * 1e6,
            "lora": (distinct * expert_bytes + pairs * lora_bytes) / bw * 1e6,
        }
        floor["fused_base"], floor["fused_lora"] = floor["base"], floor["lora"]
        row = dict(
            tokens=T,
            distinct_experts=distinct,
            expert_adapter_pairs=pairs,
            time_us=best,
            floor_us=floor,
            lora_over_base=best["lora"] / best["base"],
            base_over_floor=best["base"] / floor["base"],
            fused_lora_over_fused_base=best["fused_lora"] / best["fused_base"],
            base_over_fused_base=best["base"] / best["fused_base"],
            lora_over_fused_lora=best["lora"] / best["fused_lora"],
            fused_base_over_floor=best["fused_base"] / floor["base"],
            fused_lora_over_floor=best["fused_lora"] / floor["lora"],
            rel_err=err,
            decode_step_ms={k: v * LAYERS / 1e3 for k, v in best.items()},
        )
        report["rows"].append(row)
        print(
            f"T={T:5d} experts={distinct:3d} base {best['base']:8.1f} us  lora {best['lora']:8.1f} us  "
            f"lora/base {row['lora_over_base']:.2f}  base/floor {row['base_over_floor']:.1f} | fused base "
            f"{best['fused_base']:8.1f} us  lora {best['fused_lora']:8.1f} us  lora/base "
            f"{row['fused_lora_over_fused_base']:.2f}  grouped/fused {row['base_over_fused_base']:.1f}  "
            f"fused/floor {row['fused_base_over_floor']:.1f}  err {max(err.values()):.1e}"
        )
        save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
