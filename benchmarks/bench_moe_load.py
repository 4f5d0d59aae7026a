"""One MoE expert-LoRA adapter load, end to end, per adapter: the checkpoint read into host memory, then the slot load
into every attention and expert LoRA slot. The packed path (engine/direct_read.py straight into a page-locked arena
block, then SlotWriter: one host->device copy and one scatter (a launch per block kind), engine/expert_slots.py) against the previous
part-by-part path (load_adapter, then ExpertLoraWeights.set_slot per layer: per-tensor copies from pageable memory),
side by side in one process (issue 37).

    python -m benchmarks.bench_moe_load --out $OUT/moe-load-h200.json
    python -m benchmarks.bench_moe_load --device cpu --layers 8 --hidden 256 --inter 64 --loads 3   (CPU smoke)

Qwen3-30B-A3B shapes by default (48 layers, 128 experts top-8, hidden 2048, expert intermediate 768, q 4096, kv 512),
rank 16 on q, k, v, o and on the experts (PEFT target_parameters: 1.26 GB bf16 per adapter), written as real PEFT
checkpoints by bench/adapters.SyntheticAdapters (so read from the OS page cache, as the engine bench reads them).
Per arm ("packed": one reader thread, "parallel": its file pieces over a pool of --read-threads (the engine's
read_threads), "tensors"; interleaved, min over --repeats of medians over --loads):
- read_ms: checkpoint -> host (what a prefetch thread spends per adapter; 64 adapters cost 64 of these);
- host_ms: the slot load call returning (what blocks the step loop); load_ms: the call plus its device work, synced;
- load_GBps: adapter bytes / load_ms.
Also: first_load_ms (packed: builds and caches the scatter plan, once per adapter layout), plan_rows, and from one
profiled load per arm on CUDA: kernels, memcpys by kind and the runtime calls that wait for the device.
"""

from __future__ import annotations

import gc
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from benchmarks.timing import device_header, parser, save_report
from multilora_cli.adapters.peft import load_adapter
from multilora_cli.bench.adapters import SyntheticAdapters
from multilora_cli.economics.presets import MODEL_PRESETS
from multilora_cli.engine.direct_read import read_packed
from multilora_cli.engine.expert_slots import ExpertSlots
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.layers.lora import LoRALinear
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import _default_dtype


def model_config(layers: int | None, hidden: int | None, inter: int | None, experts: int | None) -> ModelConfig:
    cfg = dict(MODEL_PRESETS["qwen3-30b-a3b"])
    if layers:
        cfg["num_hidden_layers"] = layers
    if hidden:  # smoke shapes: 4 heads of hidden / 4 (kv 2)
        cfg.update(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4)
    if inter:
        cfg["moe_intermediate_size"] = inter
    if experts:
        cfg["num_experts"] = experts
    return ModelConfig.from_dict(cfg)


def slots(mc: ModelConfig, n: int, rank: int, dtype, device) -> tuple[dict, dict]:
    """The attention LoRA modules (qkv_proj, o_proj) and expert LoRA slots of every layer, as the model holds them."""
    mods, experts = {}, {}
    q, kv, h = mc.q_size, mc.kv_size, mc.hidden_size
    for layer in range(mc.num_hidden_layers):
        with torch.device(device), _default_dtype(dtype):
            mods[(layer, "qkv_proj")] = LoRALinear(h, [q, kv, kv], max_loras=n, max_rank=rank)
            mods[(layer, "o_proj")] = LoRALinear(q, [h], max_loras=n, max_rank=rank)
        experts[layer] = ExpertLoraWeights.empty(
            n, rank, mc.moe.num_experts, h, mc.moe.intermediate_size, dtype, device
        )
    return mods, experts


def _profile(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, copies, waits = 0, {}, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if e.name.startswith(("Memcpy", "Memset")):
                copies[e.name] = copies.get(e.name, 0) + 1
            else:
                kernels += 1
        elif e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
            waits += 1
    waits = max(0, waits - 1) + sum(n for k, n in copies.items() if "Pageable" in k)
    return dict(kernels=kernels, memcpys=copies, syncs=waits)


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--inter", type=int, default=None, help="expert intermediate size")
    p.add_argument("--experts", type=int, default=None)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--loads", type=int, default=5, help="loads per timing (a median)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--read-threads", type=int, default=8, help="the parallel arm's reader pool (EngineConfig's)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    start = time.time()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    mc = model_config(args.layers, args.hidden, args.inter, args.experts)
    src = SyntheticAdapters(mc, ["a0", "a1"], args.rank, max_distinct=2)
    src.prepare(dtype, device)  # two PEFT checkpoints on disk (read through the page cache)
    mods, experts = slots(mc, args.slots, args.rank, dtype, device)
    writer = SlotWriter(mods, device, ExpertSlots(experts, device))
    nbytes = src.nbytes * dtype.itemsize // 2
    arena = PinnedArena(3 * nbytes + (64 << 20), cuda=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    turn = [0]

    readers = ThreadPoolExecutor(args.read_threads, thread_name_prefix="lora-read")

    def read(arm: str, name: str):
        if arm in ("packed", "parallel"):
            return read_packed(src.paths[name], name, mc, dtype, arena, readers=readers if arm == "parallel" else None)
        return load_adapter(src.paths[name], name, mc, dtype=dtype)

    def timer(arm: str):
        def run() -> dict:
            reads, hosts, loads = [], [], []
            for _ in range(args.loads):
                turn[0] += 1
                name, slot = f"a{turn[0] % 2}", turn[0] % args.slots
                gc.collect()  # the previous adapter's arena block back before this read
                sync()
                t0 = time.perf_counter()
                obj = read(arm, name)
                t1 = time.perf_counter()
                writer.clear(slot)
                writer.install(slot, obj)
                t2 = time.perf_counter()
                sync()
                t3 = time.perf_counter()
                reads.append((t1 - t0) * 1e3)
                hosts.append((t2 - t1) * 1e3)
                loads.append((t3 - t1) * 1e3)
                del obj
            return dict(read=statistics.median(reads), host=statistics.median(hosts), load=statistics.median(loads))

        return run

    t0 = time.perf_counter()
    packed = read("packed", "a0")
    writer.install(0, packed)  # builds the scatter plan (CUDA) of this layout
    sync()
    first_ms = (time.perf_counter() - t0) * 1e3
    plan_rows = sum(t.rows for t in writer._plans.values())
    del packed
    writer.install(1 % args.slots, read("tensors", "a1"))  # warm-up of the other arm
    sync()
    rows: dict[str, dict] = {}
    seen: dict[str, list[dict]] = {"packed": [], "parallel": [], "tensors": []}
    for _ in range(args.repeats):
        for arm in seen:
            seen[arm].append(timer(arm)())
    for arm, runs in seen.items():
        rows[arm] = {f"{k}_ms": round(min(r[k] for r in runs), 2) for k in ("read", "host", "load")}
        rows[arm]["load_GBps"] = round(nbytes / (rows[arm]["load_ms"] * 1e-3) / 1e9, 2)
    if cuda:
        for arm in seen:
            obj = read(arm, "a0")
            rows[arm].update(_profile(lambda obj=obj: writer.install(0, obj)))
            del obj
    report = dict(
        **device_header("benchmarks.bench_moe_load"),
        shapes=dict(
            layers=mc.num_hidden_layers,
            experts=mc.moe.num_experts,
            hidden=mc.hidden_size,
            expert_intermediate=mc.moe.intermediate_size,
            rank=args.rank,
            dtype=str(dtype),
        ),
        adapter_bytes=nbytes,
        expert_bytes=src.expert_nbytes * dtype.itemsize // 2,
        first_load_ms=round(first_ms, 1),
        plan_rows=plan_rows,
        arms=rows,
        packed_vs_tensors=dict(
            read=round(rows["tensors"]["read_ms"] / rows["packed"]["read_ms"], 2),
            host=round(rows["tensors"]["host_ms"] / rows["packed"]["host_ms"], 2),
            load=round(rows["tensors"]["load_ms"] / rows["packed"]["load_ms"], 2),
        ),
        read_threads=args.read_threads,
        parallel_vs_packed_read=round(rows["packed"]["read_ms"] / rows["parallel"]["read_ms"], 2),
    )
    readers.shutdown()
    print(report)
    if args.out:
        save_report(report, args.out, start)
    return report


if __name__ == "__main__":
    main()
