"""One sparse MoE layer at Qwen3-30B-A3B shapes through the fused MoE Triton kernels (kernels/fused_moe.py):
base, and with expert LoRA of S distinct adapters, against the bytes floor at the bandwidth measured in the run.

    python -m benchmarks.bench_moe --out $OUT/moe-h200.json
    python -m benchmarks.bench_moe --tokens 1,64,256,1024 --distinct 1,16,64 --rank 16

Shapes: hidden 2048, 128 experts, top-8, expert intermediate 768, bf16; T tokens spread round-robin over S
adapters (each its own slot, rank --rank, adapting gate, up and down), every arm replayed from a CUDA graph as
decode steps run it, interleaved (min of medians). Arms: "base" (no LoRA), "row" (expert LoRA in the base GEMMs'
epilogues, one tensor-core dot per distinct adapter of a block, kernels/moe_dots.py) and "grouped" (expert LoRA
in launches grouped by (expert, adapter)), side by side at every T;
`default` names the one fused_moe picks at that T (row up to ROW_LORA_MAX_PAIRS pairs: the rows show whether that
switch sits right; T = 8192 is a prefill chunk).
The floor (benchmarks/moe_floor.py has the formulas): base = distinct experts x 3*I*H*2 B, LoRA = distinct
(expert, adapter) pairs x r*(2H + 3I)*2 B (--layout peft: gate and up share one A; modules: r*(3H + 3I)), at the
copy bandwidth measured here. Reads: per (T, S) base / lora / floor us, lora - base vs the LoRA floor (what expert
LoRA costs over what it must), the bytes each path reads and its Triton launches (dry-run counted) and programs
(static grid / busy). Per decode step of the whole model:
x 48 layers. rel_err: each LoRA arm against kernels/moe_reference.py (bf16 rounding, ~1e-3).
"""

from __future__ import annotations

import time

import torch

from benchmarks.moe_floor import expected_touched, layer_account
from benchmarks.timing import copy_bandwidth, device_header, graph_time_us, interleaved_min, ints, parser, save_report

H, E, K, INTER, LAYERS = 2048, 128, 8, 768, 48


def _launches(fn) -> int:
    from multilora_cli.kernels.launch import collect

    with collect() as calls:
        fn()
    return len(calls)


def _programs(P: int, slots: int, acc: dict, row: bool) -> dict:
    """Static grid (a graph replays all of it) and busy programs (with work) of the LoRA call's Triton kernels."""
    from multilora_cli.kernels.fused_moe import block_m_for
    from multilora_cli.kernels.moe_align import num_blocks
    from multilora_cli.kernels.moe_gemm import BN

    bm = block_m_for(P)
    nb_e, nb_es = num_blocks(P, E, bm), num_blocks(P, E * (slots + 1), bm)
    tiles = -(-INTER // BN) + -(-H // BN)  # gate_up's and down's output tiles
    gemm_static, gemm_busy = nb_e * tiles, acc["expert_blocks"] * tiles
    lora = acc["expert_adapter_blocks"]
    if row:  # one shrink (kernels/moe_lora.shrink): 16-row blocks, bm programs a block, one per distinct adapter;
        # larger, a program per (expert, slot) group (busy: ~G either way); the down shrink's sum: one per 64 pairs
        shrink = nb_e * bm if bm <= 16 else E * (slots + 1)
        sums = -(-P // 64)
        return dict(static=gemm_static + shrink + sums, busy=gemm_busy + acc["expert_adapter_pairs"] + sums)
    tiles_h = -(-2 * INTER // BN) + -(-H // BN)  # the grouped path's gate_up GEMM writes h [P, 2I]
    return dict(static=nb_e * tiles_h + 4 * nb_es, busy=acc["expert_blocks"] * tiles_h + 4 * lora)


def main(argv: list[str] | None = None) -> int:
    from multilora_cli.kernels.expert_weights import ExpertLoraWeights
    from multilora_cli.kernels.fused_moe import ROW_LORA_MAX_PAIRS, block_m_for, fused_moe
    from multilora_cli.kernels.moe_reference import moe_reference, route

    ap = parser(__doc__)
    ap.add_argument("--tokens", default="1,16,64,256,1024")
    ap.add_argument("--distinct", default="1,16,64", help="distinct adapters in the step (each has its own slot)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument(
        "--layout",
        choices=("peft", "modules"),
        default="peft",
        help="peft: target_parameters (gate and up share one A, as the e2e bench's adapters); modules: per-expert "
        "modules (gate and up each their own A)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lora-bn", default="", help="extra row arms with other output tiles, e.g. 128x64,128x128")
    ap.add_argument("--pdl-ab", action="store_true", help="also time the row path without PDL (arm row_plain)")
    ap.add_argument("--out", default="benchmarks/results/moe.json")
    args = ap.parse_args(argv)
    dev, dt, r = "cuda", torch.bfloat16, args.rank
    start = time.time()
    torch.manual_seed(0)
    gate_up = torch.randn(E, 2 * INTER, H, device=dev, dtype=dt) * 0.02
    down = torch.randn(E, H, INTER, device=dev, dtype=dt) * 0.02
    router = torch.randn(E, H, device=dev, dtype=dt) * 0.02
    slots = max(ints(args.distinct))
    lora = ExpertLoraWeights.empty(slots, r, E, H, INTER, dt, dev)
    for t in (lora.gu_a, lora.gu_b, lora.dn_a, lora.dn_b):
        t.normal_(0, 0.02)
    shared = args.layout == "peft"
    if shared:  # one lora_A of gate_up_proj: the slot holds it as gate's and up's rows (kernels/expert_weights.py)
        lora.gu_a[:, :, r:] = lora.gu_a[:, :, :r]
        lora.shared.fill_(1)
    lora.gu_scale.fill_(2.0)
    lora.dn_scale.fill_(2.0)
    lora.rank.fill_(r)
    bw = copy_bandwidth()
    shapes = dict(H=H, E=E, K=K, I=INTER, rank=r, layout=args.layout)
    report = {**device_header("benchmarks.bench_moe", bw), "shapes": shapes, "rows": []}
    us = lambda nbytes: nbytes / bw * 1e6  # noqa: E731
    per = "r(2H + 3I)" if shared else "r(3H + 3I)"
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; floor = distinct experts x 3IH x 2 B + (expert, adapter) pairs x "
          f"{per} x 2 B at it (benchmarks/moe_floor.py; --layout {args.layout})")  # fmt: skip
    for T in ints(args.tokens):
        x = torch.randn(T, H, device=dev, dtype=dt)
        w, idx = route(x @ router.T, K, "qwen", True)
        row = T * K <= ROW_LORA_MAX_PAIRS
        for S in ints(args.distinct):
            slot = (torch.arange(T, device=dev) % S).to(torch.int64)
            arms = {"row": dict(row_lora=True), "grouped": dict(row_lora=False)}
            if args.pdl_ab:  # the row path's launches chained with PDL (its default where the GPU can) vs plain
                arms["row_plain"] = dict(row_lora=True, pdl=False)
            for spec in filter(None, args.lora_bn.split(",")):  # e.g. 128x64: gate_up's and down's BN
                g, d = (int(v) for v in spec.split("x"))
                arms[f"row_bn{spec}"] = dict(row_lora=True, lora_bn=(g, d))
            timers = {
                name: (lambda kw=kw: graph_time_us(lambda _: fused_moe(x, w, idx, gate_up, down, slot, lora, **kw), 1))
                for name, kw in arms.items()
            }
            timers["base"] = lambda: graph_time_us(lambda _: fused_moe(x, w, idx, gate_up, down), 1)
            best = interleaved_min(timers, args.repeats)
            ref = moe_reference(x, w, idx, gate_up, down, slot, lora).double()
            err = {}
            for name, kw in arms.items():
                got = fused_moe(x, w, idx, gate_up, down, slot, lora, **kw).double()
                err[name] = ((got - ref).norm() / ref.norm()).item()
            acc = layer_account(idx, slot, E, H, INTER, r, block_m_for(T * K), shared)
            floor_base, floor_lora = us(acc["floor_base_bytes"]), us(acc["floor_lora_bytes"])
            launches = {
                "base": _launches(lambda: fused_moe(x, w, idx, gate_up, down)),
                **{n: _launches(lambda kw=kw: fused_moe(x, w, idx, gate_up, down, slot, lora, **kw)) for n, kw in arms.items()},
            }  # fmt: skip
            programs = {n: _programs(T * K, slots, acc, n != "grouped") for n in arms}
            extra = {n: best[n] - best["base"] for n in arms}
            rec = dict(
                distinct=S,
                default="row" if row else "grouped",
                time_us=best,
                floor_us={"base": floor_base, "lora": floor_lora},
                lora_extra_us=extra,
                lora_extra_over_floor={n: v / floor_lora for n, v in extra.items()},
                lora_over_base={n: best[n] / best["base"] for n in arms},
                floor_lora_over_base=(floor_base + floor_lora) / floor_base,
                base_over_floor=best["base"] / floor_base,
                expected_expert_adapter_pairs=min(T, S) * expected_touched(E, K, T / min(T, S)),
                launches=launches,
                programs=programs,
                rel_err=err,
                decode_step_ms={k: v * LAYERS / 1e3 for k, v in best.items()},
                **acc,
            )
            report["rows"].append(rec)
            print(
                f"T={T:5d} S={S:3d} experts {acc['distinct_experts']:3d} (expert, adapter) {acc['expert_adapter_pairs']:5d}"
                f" | base {best['base']:7.1f} us floor {floor_base:6.1f} | LoRA floor +{floor_lora:6.1f} us"
                f" | row {best['row']:7.1f} us (+{extra['row']:6.1f}, {extra['row'] / floor_lora:.1f}x floor)"
                f" grouped {best['grouped']:7.1f} us (+{extra['grouped']:6.1f}) default {rec['default']}"
                + "".join(f" {n} {best[n]:7.1f} us" for n in arms if n.startswith("row_"))
                + f" | row/base {rec['lora_over_base']['row']:.2f} floor {rec['floor_lora_over_base']:.2f}"
                f" | LoRA MB floor {acc['floor_lora_bytes'] / 1e6:.0f} row ~{acc['row_lora_dram_bytes'] / 1e6:.0f}"
                f" (<= {acc['row_lora_bytes'] / 1e6:.0f} without cache reuse)"
                f" grouped {acc['grouped_lora_bytes'] / 1e6:.0f} | launches {launches} programs {programs}"
                f" | err {max(err.values()):.1e}"
            )  # fmt: skip
            save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
