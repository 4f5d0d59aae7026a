"""One slot load, alone: host time, device time, kernel launches, copies and host syncs (issues 34 and 38).

    python -m benchmarks.bench_slot_load --out $OUT/slot-load-h200.json

Llama-3-8B shapes by default (32 layers of q|k|v, o, gate|up, down LoRA modules, bf16, random base weights),
a rank-16 adapter on all seven projections, packed in a page-locked arena block as `Engine._load_cpu` leaves it,
loaded by `SlotWriter.install` into slots in turn. Arms, interleaved and repeated (min of medians):
- "plain": a plain LoRA load (copy of the packed buffer, one scatter, rank / scaling rows);
- "dora": a DoRA load (the same, with the magnitudes in the buffer, then `DoraNorms.write`);
- "dora_per_slice": the same load with the norms computed the previous way, slice by slice (`slice_scale`, m moved
  from pageable host memory per slice): the baseline the "dora" arm replaced, side by side in this process.
Per arm: host_ms (the call returning: what blocks the step loop), load_ms (the call plus the device work, synced),
and from one profiled load: kernels, memcpys by kind, and the CUDA runtime calls that wait for the device
(synchronize calls and copies from pageable memory). `--preset llama-3.2-1b` for issue 38's shapes;
`--device cpu --layers 2 --hidden 64` is a smoke run (no profile).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.timing import device_header, interleaved_min, parser, save_report
from multilora_cli.adapters.peft import SLICES, LoraAdapter, LoraModule
from multilora_cli.engine.dora import row_norms_sq, slice_scale
from multilora_cli.engine.packed import pack_adapter
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.layers.lora import LoRALinear
from multilora_cli.models.loader import _default_dtype

PRESETS = {  # name -> (layers, hidden, q, kv, intermediate)
    "llama-3-8b": (32, 4096, 4096, 1024, 14336),
    "llama-3.2-1b": (16, 2048, 2048, 512, 8192),
}
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def _modules(layers, h, q, kv, inter, max_loras, rank, dtype, device):
    torch.manual_seed(0)
    mods = {}
    for layer in range(layers):
        for name, fin, outs in (
            ("qkv_proj", h, [q, kv, kv]),
            ("o_proj", q, [h]),
            ("gate_up_proj", h, [inter, inter]),
            ("down_proj", inter, [h]),
        ):
            with torch.device(device), _default_dtype(dtype):  # built in place: no 15 GB host copy
                m = LoRALinear(fin, outs, max_loras=max_loras, max_rank=rank)
            m.weight.data.normal_(0, 0.02)
            mods[(layer, name)] = m
    return mods


def _adapter(mods, rank, dora: bool, dtype) -> LoraAdapter:
    g = torch.Generator().manual_seed(1)
    modules, mags = {}, {}
    for (layer, fused), m in mods.items():
        offs = m.lora.slice_offsets
        for i, name in enumerate(SLICES[fused]):
            out = offs[i + 1] - offs[i]
            a = (torch.randn(rank, m.lora.in_features, generator=g) * 0.02).to(dtype)
            modules[(layer, name)] = LoraModule(
                a=a, b=(torch.randn(out, rank, generator=g) * 0.02).to(dtype), scaling=2.0
            )
            if dora:
                mags[(layer, name)] = torch.rand(out, generator=g) + 0.5
    return LoraAdapter(
        name="dora" if dora else "plain",
        path=None,
        config=None,
        modules=modules,
        base_model=None,
        weights_path=None,
        stored_dtype=dtype,
        stored_nbytes=0,
        magnitudes=mags,
    )


def _per_slice(writer: SlotWriter, slot: int, packed, host_mags, w_sq) -> None:
    """The previous DoRA load: A / B as today, then one norm per slice with m copied from pageable memory."""
    writer._install_packed(slot, packed)
    for (layer, fused), module in writer.modules:
        w = module.lora
        row = w.dora[slot]
        row.fill_(1.0)
        for i, name in enumerate(SLICES[fused]):
            lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
            spec = packed.modules[(layer, name)]
            r = spec.rank
            row[lo:hi] = slice_scale(
                module.weight[lo:hi],
                w.a[slot, i, :r],
                w.b[slot, lo:hi, :r],
                spec.scaling,
                host_mags[(layer, name)],
                w_sq[(layer, fused)][lo:hi],
            )


def _profile(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, copies, runtime = 0, {}, {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if e.name.startswith("Memcpy") or e.name.startswith("Memset"):
                copies[e.name] = copies.get(e.name, 0) + 1
            else:
                kernels += 1
        elif e.name.startswith("cu") and not e.name.startswith("cuda::"):
            runtime[e.name] = runtime.get(e.name, 0) + 1
    waits = max(0, sum(n for k, n in runtime.items() if k in SYNCS) - 1)  # less the profile's own synchronize
    waits += sum(n for k, n in copies.items() if "Pageable" in k)
    return dict(kernels=kernels, memcpys=copies, syncs=waits, runtime_calls=dict(sorted(runtime.items())))


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--preset", choices=sorted(PRESETS), default="llama-3-8b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None, help="smoke runs: hidden = q, kv = hidden / 4, I = 3.5 x")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--loads", type=int, default=10, help="loads per timing (a median)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    start = time.time()
    layers, h, q, kv, inter = PRESETS[args.preset]
    if args.hidden:
        h, q, kv, inter = args.hidden, args.hidden, args.hidden // 4, args.hidden * 7 // 2
    layers = args.layers or layers
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    mods = _modules(layers, h, q, kv, inter, args.slots, args.rank, dtype, device)
    writer = SlotWriter(mods, device)
    writer.enable_dora()
    arena = PinnedArena(1 << 30, cuda=cuda) if cuda else None
    plain = pack_adapter(_adapter(mods, args.rank, False, dtype), pin=False, dtype=dtype, arena=arena)
    dora = pack_adapter(_adapter(mods, args.rank, True, dtype), pin=False, dtype=dtype, arena=arena)
    host_mags = {k: m.clone() for k, m in dora.magnitudes.items()}  # pageable, as load_adapter left them
    w_sq = {k: row_norms_sq(m.weight) for k, m in mods.items()}
    turn = [0]

    def slot() -> int:
        turn[0] += 1
        return turn[0] % args.slots

    arms = {
        "plain": lambda: writer.install(slot(), plain),
        "dora": lambda: writer.install(slot(), dora),
        "dora_per_slice": lambda: _per_slice(writer, slot(), dora, host_mags, w_sq),
    }
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timer(fn, with_device: bool):
        def run() -> float:
            times = []
            for _ in range(args.loads):
                sync()
                t0 = time.perf_counter()
                fn()
                if with_device:
                    sync()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)

        return run

    for fn in arms.values():  # warm-up: compiles, cached plans and indexes
        fn()
        sync()
    host = interleaved_min({k: timer(fn, False) for k, fn in arms.items()}, args.repeats)
    load = interleaved_min({k: timer(fn, True) for k, fn in arms.items()}, args.repeats)
    rows = {k: dict(host_ms=round(host[k], 3), load_ms=round(load[k], 3)) for k in arms}
    # the same norms both ways (float32 rounding apart): the arms compare like with like
    writer.install(0, dora)
    _per_slice(writer, 1, dora, host_mags, w_sq)
    scales = writer._dora.rows
    diff = float((scales[0] - scales[1]).abs().max() / scales[1].abs().max())
    if cuda:
        for k, fn in arms.items():
            rows[k].update(_profile(fn))
    report = dict(
        **device_header("benchmarks.bench_slot_load"),
        shapes=dict(layers=layers, hidden=h, q=q, kv=kv, intermediate=inter, rank=args.rank, dtype=str(dtype)),
        adapter_bytes=plain.flat.numel() * plain.flat.element_size(),
        dora_extra_bytes=(dora.flat.numel() - plain.flat.numel()) * dora.flat.element_size(),
        arms=rows,
        dora_rel_diff_vs_per_slice=diff,
        dora_vs_per_slice_load=round(rows["dora"]["load_ms"] / max(rows["dora_per_slice"]["load_ms"], 1e-9), 3),
        dora_vs_plain_load=round(rows["dora"]["load_ms"] / max(rows["plain"]["load_ms"], 1e-9), 3),
    )
    print(report)
    if args.out:
        save_report(report, args.out, start)
    return report


if __name__ == "__main__":
    main()
