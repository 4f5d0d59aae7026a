"""A/B: the LoRA shrink after the base matmul (one stream) vs beside it (kernels/overlap.py, a side stream).

    PYTHONPATH=. python3 benchmarks/ab_lora_stream.py --out $OUT/ab-lora-stream.json

The linear layers of a Llama-3-8B decode step (32 layers of qkv, o, gate_up + SiLU-and-mul, down as
`LoRALinear`, random bf16 weights, rank-16 adapters in a 64-slot pool), chained as a layer chains them
(attention left out: it does not touch the LoRA path; a plain rms_norm stands in for the norms), captured
in one CUDA graph per arm:
  base:    no LoRA context (the matmuls alone: the floor both LoRA arms sit on)
  serial:  shrink + expand after each matmul (what the engine ran before)
  overlap: shrink on a side stream beside the matmul, expand after both; at default and at high stream priority
Arms alternate within one process over the same weights and inputs; medians of graph replays (CUDA events);
LoRA cost = arm - base. Outputs of serial and overlap are compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from multilora_cli.kernels import LoraMetaBuffers  # noqa: E402
from multilora_cli.layers.context import StepContext, reset_context, set_context  # noqa: E402
from multilora_cli.layers.lora import LoRALinear  # noqa: E402

H, I, KV, LAYERS = 4096, 14336, 1024, 32
DT = torch.bfloat16


class Layer(torch.nn.Module):
    def __init__(self, max_loras: int, rank: int):
        super().__init__()
        kw = dict(max_loras=max_loras, max_rank=rank)
        self.qkv = LoRALinear(H, [H, KV, KV], **kw)
        self.o = LoRALinear(H, [H], **kw)
        self.gate_up = LoRALinear(H, [I, I], **kw)
        self.down = LoRALinear(I, [H], **kw)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # rms_norm stands in for the layer's norms (keeps 32 layers of random weights finite, so the arms'
        # outputs can be compared bit for bit); the qkv slice stands in for attention's output
        a = self.qkv(F.rms_norm(h, (H,)))[:, :H]
        h = h + self.o(a)
        return h + self.down(self.gate_up.forward_silu_mul(F.rms_norm(h, (H,))))


def build(layers: int, max_loras: int, rank: int) -> torch.nn.ModuleList:
    torch.set_default_dtype(DT)  # the LoRA pools take the weights' dtype at construction
    with torch.device("cuda"):
        mods = torch.nn.ModuleList(Layer(max_loras, rank) for _ in range(layers))
    torch.set_default_dtype(torch.float32)
    for m in mods.modules():
        if isinstance(m, LoRALinear):
            m.weight.data.normal_(0, m.in_features ** -0.5)
            w = m.lora
            w.a.normal_(0, m.in_features ** -0.5)
            w.b.normal_(0, 0.05)
            w.rank.fill_(rank)
            w.scale.fill_(2.0)
    return mods


def context(t: int, meta, stream) -> StepContext:
    z = torch.zeros(t, dtype=torch.int32, device="cuda")
    return StepContext(is_prefill=False, slot_mapping=z.long(), seqlens_q=[1] * t, seqlens_k=[1] * t,
                       context_lens=z, block_tables=z.view(t, 1), lora=meta, lora_stream=stream)


def capture(mods, x: torch.Tensor, ctx: StepContext | None):
    def step():
        h = x
        for m in mods:
            h = m(h)
        return h

    set_context(ctx)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()  # compile + allocate outside the graph
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step()
    finally:
        reset_context()
    return g, out


def replay_ms(g, n: int) -> float:
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="256,64;256,16;64,64;16,8", help="tokens,adapters;...")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    mods = build(args.layers, 64, args.rank)
    sides = {"overlap": torch.cuda.Stream(), "overlap_hi": torch.cuda.Stream(priority=-1)}
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": args.layers,
              "rank": args.rank, "max_loras": 64, "command": " ".join(sys.argv), "points": []}
    for spec in args.points.split(";"):
        t, adapters = (int(v) for v in spec.split(","))
        x = torch.randn(t, H, device="cuda", dtype=DT)
        bufs = LoraMetaBuffers(t, 64, "cuda")
        meta = bufs.build([i % adapters for i in range(t)])
        arms = {"base": capture(mods, x, None), "serial": capture(mods, x, context(t, meta, None))}
        for name, side in sides.items():
            arms[name] = capture(mods, x, context(t, meta, side))
        for g, _ in arms.values():
            g.replay()
        torch.cuda.synchronize()
        same = {k: bool(torch.equal(arms["serial"][1], arms[k][1])) for k in sides}
        assert torch.isfinite(arms["serial"][1]).all(), "the chain overflowed: the bit comparison would mean nothing"
        times: dict[str, list[float]] = {k: [] for k in arms}
        for _ in range(args.reps):
            for k, (g, _) in arms.items():
                times[k].append(replay_ms(g, args.replays))
        best = {k: min(v) for k, v in times.items()}
        row = {"tokens": t, "adapters": adapters, "ms": best, "all_ms": times, "bit_identical": same,
               "lora_ms": {k: best[k] - best["base"] for k in arms if k != "base"}}
        report["points"].append(row)
        print(f"T={t:4d} adapters={adapters:3d} " + " ".join(f"{k} {v:.3f}" for k, v in best.items())
              + "  lora: " + " ".join(f"{k} {v:.3f}" for k, v in row["lora_ms"].items()) + f"  same={same}",
              flush=True)
        del arms
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"done in {time.time() - t0:.0f} s", file=sys.stderr)
    sys.exit(rc)
