"""Run benchmark rows: multilora with adapters, multilora base-only, HF + PEFT; each row a `BenchRow`.

A multilora row: build a dummy-weight engine, warm it up on the same kind of workload with *other* adapters
(Triton compiles, graph capture and allocator growth stay out of the timing, and the timed run still starts
with every one of its adapters cold), then time `Engine.generate` over all requests. The runner's step log
gives per-step times, which are set against the decode roofline.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from multilora_cli.bench.adapters import SyntheticAdapters, SyntheticEngine
from multilora_cli.bench.roofline import Roofline, measure_bandwidth, measure_matmul_flops
from multilora_cli.bench.workload import Workload
from multilora_cli.config import GPU_MEMORY_UTILIZATION, EngineConfig, LineKind
from multilora_cli.engine.host_budget import HostCacheChoice, choose_max_cpu_loras
from multilora_cli.engine.slot_budget import SlotChoice, SlotInputs, choose_max_loras, slot_bytes, spare_gpu_bytes
from multilora_cli.models.config import ModelConfig


@dataclass(slots=True)
class BenchRow:
    """One measured configuration. system: "multilora" | "multilora-base" | "hf-peft"."""

    system: str
    workload: dict
    tokens_per_s: float
    output_tokens: int = 0
    wall_s: float = 0.0
    decode_step_ms: float | None = None  # median decode step at the most common decode batch size
    decode_batch: int | None = None  # that batch size
    roofline_ms: float | None = None  # median roofline (bytes / bandwidth) of those same steps
    decode_vs_roofline: float | None = None  # sum of all decode step times / sum of their rooflines
    floor_ms: float | None = None  # median max(bytes / bandwidth, matmul FLOPs / matmul rate) of those steps
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def engine_config(
    work: Workload, model_dir: Path, device: torch.device, *, enforce_eager: bool = False
) -> EngineConfig:
    """Engine settings of a row: dummy weights, KV sized for max_num_seqs full-length sequences (+1 block each);
    a workload without its own slots gets `multilora run`'s default (`resolve_slots`), and its host cache is
    `multilora run`'s default too (`host_cache`)."""
    if work.max_loras is None:
        work, _ = resolve_slots(work, ModelConfig.from_dir(model_dir), device)
    return EngineConfig(
        model=str(model_dir),
        dtype="bfloat16" if device.type == "cuda" else "float32",
        device=device.type,
        max_loras=work.max_loras,
        max_lora_rank=max(16, work.rank),
        max_cpu_loras=max(host_cache(work, ModelConfig.from_dir(model_dir), device).max_cpu_loras, work.max_loras),
        max_num_seqs=work.max_num_seqs,
        max_num_batched_tokens=work.max_num_batched_tokens,
        max_model_len=work.total_prompt_len + work.output_len,
        block_size=KV_BLOCK,
        num_kv_blocks=kv_blocks(work),
        load_format="dummy",
        enforce_eager=enforce_eager,
        lazy_capture=False,  # every decode graph captured before the timed run: rows time steady steps
        seed=work.seed,
        quantization=work.quantization,
        fp8_small_m=work.fp8_small_m,
        prefix_cache=work.prefix_cache,
        read_threads=work.read_threads,
        # what its requests ask of the sampler: the precompile compiles those variants only (engine/dry_sample.py)
        line_kinds=frozenset(
            {LineKind(base=work.num_adapters == 0, sampled=work.sampled, top_p=work.sampled and work.top_p < 1.0)}
        ),
    )


KV_BLOCK = 16  # tokens per KV block of a bench row


def kv_blocks(work: Workload) -> int:
    """A row's KV cache: max_num_seqs sequences of prompt + output tokens, one block to spare each."""
    return work.max_num_seqs * (-(-(work.total_prompt_len + work.output_len) // KV_BLOCK) + 1)


def resolve_slots(
    work: Workload, cfg: ModelConfig, device: torch.device, dora: bool = False
) -> tuple[Workload, SlotChoice]:
    """The row's slots: its own, else `multilora run`'s default on this device (engine/slot_budget.py), for the
    KV the row allocates (max_num_seqs sequences of prompt + output tokens)."""
    if work.max_loras is not None:
        return work, SlotChoice(work.max_loras, f"--max-loras {work.max_loras}")
    itemsize = 2 if device.type == "cuda" else 4  # engine_config: bfloat16 on a GPU, float32 on CPU
    one = slot_bytes(cfg, max(16, work.rank), itemsize)
    if dora:  # run/setup.slot_choice counts DoRA's fp32 scale rows in every slot
        from multilora_cli.adapters.costs import dora_slot_bytes

        one += dora_slot_bytes(cfg)
    fp8 = work.quantization == "fp8"
    choice = choose_max_loras(
        SlotInputs(
            adapters=work.num_adapters,
            one_slot=one,
            spare=spare_gpu_bytes(device.type, cfg, itemsize, GPU_MEMORY_UTILIZATION, fp8=fp8),
            max_num_seqs=work.max_num_seqs,
            context=work.total_prompt_len + work.output_len,
            kv_token=cfg.kv_bytes_per_token(itemsize),
            kv_cap=kv_blocks(work) * KV_BLOCK * cfg.kv_bytes_per_token(itemsize),  # the row's fixed KV cache
        )
    )
    return replace(work, max_loras=choice.max_loras), choice


def host_cache(
    work: Workload, cfg: ModelConfig, device: torch.device, host_bytes: int | None = None
) -> HostCacheChoice:
    """The row's host cache: `multilora run`'s default (engine/host_budget.py) for its adapters, each of one
    slot's bytes (the synthetic adapters adapt every projection at `work.rank`), beside a wave of reads in
    flight; a warning when they do not all fit the pinned share of host memory (the Llama-3-8B row of 1,000
    adapters: 84 GB against a 32 GiB share of a 128 GiB host), the rest then read from disk at their loads."""
    if not work.num_adapters:
        return HostCacheChoice(max(work.max_loras or 1, 1), "no adapters")
    itemsize = 2 if device.type == "cuda" else 4
    one = slot_bytes(cfg, work.rank, itemsize)  # (DoRA's magnitudes add ~0.1%)
    in_flight = min(work.max_loras or work.max_num_seqs, work.max_num_seqs)  # SlotManager.read_ahead
    return choose_max_cpu_loras([one] * work.num_adapters, in_flight, None, host_bytes)


def run_multilora_row(
    work: Workload,
    model_dir: Path,
    device: torch.device,
    *,
    bandwidth: float,
    flops: float = 0.0,
    base_only: bool = False,
    enforce_eager: bool = False,
    warmup: bool = True,
    host_warm: bool = False,
    dora: bool = False,
    log=print,
) -> BenchRow:
    """Time one multilora configuration (`base_only`: no adapters, no LoRA layers at all; `dora`: the adapters
    are DoRA adapters, their warm-up adapters too)."""
    cfg = ModelConfig.from_dir(model_dir)
    work, slots = resolve_slots(work, cfg, device, dora=dora)
    host = host_cache(work, cfg, device)  # what engine_config gives the engine
    if host.warning:
        log(f"  warning: {host.warning}")
    slots = replace(slots, host_cache=host.reason)
    econf = engine_config(work, model_dir, device, enforce_eager=enforce_eager)
    source = None
    n_warm = max(min(work.num_requests, 2 * work.max_num_seqs), work.n)  # warm-up requests
    warm_slots = min(work.max_loras, n_warm)  # warm adapters: no more than the warm-up can use
    if not base_only and work.num_adapters:
        warm_names = [f"warm{i}" for i in range(warm_slots)]
        source = SyntheticAdapters(
            cfg,
            work.adapter_names + warm_names,
            work.rank,
            seed=work.seed,
            max_distinct=work.distinct_weights,
            dora=dora,
        )
    if source is not None:  # PEFT folders on disk before the engine starts (not timed)
        source.prepare(getattr(torch, econf.dtype), device)
    t0 = time.perf_counter()
    engine = SyntheticEngine(econf, source, cfg)
    startup = time.perf_counter() - t0
    try:
        if warmup:
            n = n_warm
            # long enough that sequences finish in waves and mixed prefill/decode steps of many sizes occur:
            # Triton specialises kernels on step sizes, and a compile inside the timed run costs seconds
            ww = replace(work, num_requests=n, output_len=min(work.output_len, 32), seed=work.seed + 7)
            reqs = ww.requests(cfg.vocab_size)
            if source is not None:  # other adapters: the timed run starts with its own adapters cold
                for i, r in enumerate(reqs):
                    r.adapter = f"warm{i % warm_slots}"
            elif base_only:
                for r in reqs:
                    r.adapter = None
            engine.generate_all(reqs)
            # the warm-up's adapters leave their slots: else the timed run's own adapters evict them, though the
            # row gives every one of its adapters a slot (issue 38: 375 evictions at 1,000 slots)
            engine.slots.evict_idle()
        reqs = work.requests(cfg.vocab_size)
        if base_only:
            for r in reqs:
                r.adapter = None
        if host_warm and source is not None:  # adapters already read + packed in host memory, slots still cold
            for name in {r.adapter for r in reqs if r.adapter is not None}:
                engine.slots.warm(name)
        # live counters (engine.stats syncs at the end of a run: it misses the warm-up's evict_idle)
        loads0, evict0, preload0 = engine.slots.loads, engine.slots.evictions, engine.slots.preloads
        caller0 = engine.slots.caller_reads
        bm = engine.block_manager
        lookup0, hits0 = bm.prompt_tokens, bm.hit_tokens
        install_s = _time_installs(engine)
        staging0 = engine.runner.staging_stats()
        sched0, wait0 = engine.schedule_seconds, engine.slots.read_wait_seconds
        stall0 = engine.runner.load_stalls()
        host0 = (engine.feed_seconds, engine.results_seconds, engine.preload_seconds)
        ids0 = (engine.identities.caller_hashes, engine.identities.caller_seconds, engine.scheduler.num_ahead_steps)
        gc_clock = GcClock()
        engine.runner.step_log = []
        _sync(device)
        alloc0 = _allocator_counts(device)
        t0 = time.perf_counter()
        with gc_clock:
            results = list(engine.generate(reqs))
        wall = time.perf_counter() - t0
        alloc = {k: v - alloc0.get(k, 0) for k, v in _allocator_counts(device).items()}
        steps = engine.runner.step_log
        engine.runner.step_log = None
        stall = engine.runner.load_stalls()  # (after the run's last collect: every timed wait has completed)
        errors = [r for r in results if r.error is not None]
        if errors:
            raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0].error.one_line()}")
        out_tokens = sum(r.completion_tokens for r in results)
        sequences = sum(max(1, len(r.samples)) for r in results)
        dtype_bytes = torch.tensor([], dtype=engine.runner.dtype).element_size()
        fp8 = work.quantization == "fp8"
        roof = Roofline.for_model(
            cfg,
            dtype_bytes,
            source.nbytes if source else 0,
            bandwidth,
            flops,
            fp8=fp8,
            adapter_expert_bytes=source.expert_nbytes if source else 0,
        )
        system = ("multilora-base" if base_only else "multilora") + ("-fp8" if fp8 else "")
        system += "-eager" if enforce_eager else ""
        system += "-dora" if dora else ""
        row = _summarise(work, steps, roof, system, out_tokens, wall)
        fed = sum(s.tokens for s in steps)
        # every generated token but each sequence's last is fed back once; the rest of what was fed is prompt
        # (prefill, chunks, recomputes after preemption)
        row.extra.update(fed_tokens=fed, prefill_tokens=fed - (out_tokens - sequences), sequences=sequences)
        if work.n > 1:
            row.extra["note"] = f"{work.n} separate requests a prompt" if work.separate_n else f"n={work.n}"
        row.extra.update(
            startup_s=startup,
            capture_s=engine.runner.capture_seconds,
            precompile_s=engine.runner.precompile_seconds,
            precompiled=engine.runner.precompiled,
            slot_loads=engine.slots.loads - loads0,
            slot_evictions=engine.slots.evictions - evict0,
            slot_preloads=engine.slots.preloads - preload0,  # loads made while a step ran (Scheduler.preload)
            enforce_eager=enforce_eager,
            preemptions=engine.stats.preemptions,
            install_host_s=install_s[0],
            host_warm=host_warm,
            staging={k: v - staging0.get(k, 0) for k, v in engine.runner.staging_stats().items()},
            pinned_arena=engine.arena.stats() if engine.arena is not None else None,
            arena_s=engine.arena_seconds,
            # slot loads whose NaN / Inf check ran on the device (engine/slot_writer.py) instead of the host
            device_checks=engine.runner.adapters.writer.device_checks if engine.runner.max_loras else 0,
            schedule_s=engine.schedule_seconds - sched0,
            read_wait_s=engine.slots.read_wait_seconds - wait0,
            caller_reads=engine.slots.caller_reads - caller0,  # adapter reads on the step loop's thread
            # GPU time steps waited for the slot loads they read (inside the steps' times, prefill or decode)
            load_stall_s=stall[1] - stall0[1],
            load_stalled_steps=stall[0] - stall0[0],
            # the rest of host_outside_steps_s: feeding requests (tokenize, queue), making results, preloads (in
            # schedule_s too), garbage collection (any thread)
            feed_s=engine.feed_seconds - host0[0],
            results_s=engine.results_seconds - host0[1],
            preload_s=engine.preload_seconds - host0[2],
            gc_s=gc_clock.seconds,
            gc_collections=gc_clock.collections,
            # adapter identities still hashed on the step loop at admission (engine/identities.py), and steps
            # launched ahead (their host time hidden behind the step before; the others' is outside steps)
            identity_loop_hashes=engine.identities.caller_hashes - ids0[0],
            identity_loop_s=engine.identities.caller_seconds - ids0[1],
            ahead_steps=engine.scheduler.num_ahead_steps - ids0[2],
            slots=slots.to_dict(),
            # CUDA caching allocator over the timed run: retries free every cached block (a device sync) and
            # allocate again; device mallocs / frees past the warm-up are new shapes or memory pressure
            allocator=alloc,
            prefix_cache={"prompt_tokens": bm.prompt_tokens - lookup0, "hit_tokens": bm.hit_tokens - hits0},
        )
        log(
            f"  {row.system} {work.num_adapters} adapters ({work.distribution}, {work.max_loras} slots): "
            f"{row.tokens_per_s:.0f} tok/s, decode step {row.decode_step_ms or 0:.2f} ms at batch "
            f"{row.decode_batch} (roofline {row.roofline_ms or 0:.2f} ms of its "
            f"{row.extra.get('adapters_at_batch', 0):.0f} distinct adapters: "
            f"{row.extra.get('step_vs_roofline') or 0:.2f}x"
            + "".join(f", {k} {v:.2f}" for k, v in row.extra.get("roofline_parts_ms", {}).items() if v)
            + f"; all decode steps {row.decode_vs_roofline or 0:.2f}x theirs)"
        )
        return row
    finally:
        engine.close()
        del engine
        _free(device)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def _sum_gpu(steps) -> float | None:
    return None if any(s.gpu_seconds is None for s in steps) else sum(s.gpu_seconds for s in steps)


class GcClock:
    """Time spent in garbage collection while inside the `with` (gc.callbacks), and how many of each generation."""

    def __init__(self):
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t = 0.0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.collections[info["generation"]] += 1

    def __enter__(self):
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._cb)


def _time_installs(engine) -> list[float]:
    """Wrap the slot manager's install callback to sum its host time (no sync: what the step loop waits for);
    returns the one-element list the sum accumulates in."""
    acc = [0.0]
    install = engine.slots._install

    def timed(slot, name, obj):
        t = time.perf_counter()
        try:
            install(slot, name, obj)
        finally:
            acc[0] += time.perf_counter() - t

    engine.slots._install = timed
    return acc


def _allocator_counts(device: torch.device) -> dict:
    """The CUDA caching allocator's retry / device malloc / device free counters ({} off CUDA)."""
    if device.type != "cuda":
        return {}
    st = torch.cuda.memory_stats(device)
    return {k: st.get(k, 0) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free")}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summarise(work: Workload, steps, roof: Roofline, system: str, out_tokens: int, wall: float) -> BenchRow:
    decode = [s for s in steps if s.decode]
    row = BenchRow(
        system=system, workload=work.to_dict(), tokens_per_s=out_tokens / wall, output_tokens=out_tokens, wall_s=wall
    )
    if decode:
        common = statistics.mode(s.seqs for s in decode)
        at = [s for s in decode if s.seqs == common]
        row.decode_batch = common
        row.decode_step_ms = statistics.median(s.seconds for s in at) * 1e3
        row.roofline_ms = statistics.median(roof.step_seconds(s.kv_tokens, s.adapters, s.tokens) for s in at) * 1e3
        row.decode_vs_roofline = sum(s.seconds for s in decode) / sum(
            roof.step_seconds(s.kv_tokens, s.adapters, s.tokens) for s in decode
        )
        row.floor_ms = statistics.median(roof.floor_seconds(s.tokens, s.kv_tokens, s.adapters) for s in at) * 1e3
        # the 8B target: the step at that batch against the roofline of its own distinct adapters
        row.extra["step_vs_roofline"] = row.decode_step_ms / row.roofline_ms
        row.extra["adapters_at_batch"] = statistics.median(s.adapters for s in at)
        # the median step's roofline by part (ms at the measured bandwidth): where a MoE step's floor lies
        mid = sorted(at, key=lambda s: roof.step_seconds(s.kv_tokens, s.adapters, s.tokens))[len(at) // 2]
        parts = roof.step_parts(mid.kv_tokens, mid.adapters, mid.tokens)
        row.extra["roofline_parts_ms"] = {k: v / roof.bandwidth * 1e3 for k, v in parts.items()}
        row.extra["roofline_step"] = dict(tokens=mid.tokens, adapters=mid.adapters, kv_tokens=mid.kv_tokens)
        row.extra["decode_vs_floor"] = sum(s.seconds for s in decode) / sum(
            roof.floor_seconds(s.tokens, s.kv_tokens, s.adapters) for s in decode
        )
    other = [s for s in steps if not s.decode]
    row.extra.update(
        steps=len(steps),
        decode_steps=len(decode),
        graph_steps=sum(s.graph for s in steps),
        decode_s=sum(s.seconds for s in decode),
        prefill_s=sum(s.seconds for s in other),
        # every step with prompt tokens, in order (where prefill goes): [tokens, sequences, distinct adapters, ms,
        # ms until all queued, ms of device time (None off CUDA), slot loads since the step before]
        # (engine/step_record.StepRecord)
        prefill_steps=[
            [s.tokens, s.seqs, s.adapters, *(_ms(v) for v in (s.seconds, s.enqueue_seconds, s.gpu_seconds)), s.loads]
            for s in other
        ],
        # every decode step in order: [sequences, distinct adapters, ms, ms until queued, ms of device time, slot
        # loads since the step before]: where decode time goes past the median step (loads, waves' ends, the host)
        decode_trace=[
            [s.seqs, s.adapters, *(_ms(v) for v in (s.seconds, s.enqueue_seconds, s.gpu_seconds)), s.loads]
            for s in decode
        ],
        # device time of the steps, summed (None off CUDA): what the kernels took, beside the steps' wall time
        decode_gpu_s=_sum_gpu(decode),
        prefill_gpu_s=_sum_gpu(other),
        host_outside_steps_s=wall - sum(s.seconds for s in steps),
        mean_adapters_per_decode_step=statistics.fmean(s.adapters for s in decode) if decode else 0.0,
        roofline_weight_gb=roof.weight_bytes / 1e9,
        roofline_adapter_mb=roof.adapter_bytes / 1e6,
        roofline_expert_mb=roof.expert_bytes / 1e6,  # MoE: one expert, all layers (0 on a dense base)
        roofline_adapter_expert_mb=roof.adapter_expert_bytes / 1e6,
        roofline_kv_kb_per_token=roof.kv_bytes_per_token / 1e3,
    )
    return row


def run_hf_row(
    work: Workload,
    model_dir: Path,
    device: torch.device,
    *,
    batch_sizes: list[int],
    new_tokens: tuple[int, int] = (2, 4),
    log=print,
) -> BenchRow:
    """HF + PEFT at several batch sizes; the row reports the best (extrapolated) one, all in `extra`."""
    from multilora_cli.bench.hf_peft import build_hf_peft, time_hf_peft

    cfg = ModelConfig.from_dir(model_dir)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = build_hf_peft(model_dir, work, device, dtype)
    build_s = time.perf_counter() - t0
    try:
        sizes = time_hf_peft(model, work, cfg.vocab_size, device, batch_sizes, new_tokens, log=log)
    finally:
        del model
        _free(device)
    best = max(sizes, key=lambda r: r["tokens_per_s"])
    return BenchRow(
        system="hf-peft",
        workload=work.to_dict(),
        tokens_per_s=best["tokens_per_s"],
        decode_step_ms=best["step_ms"],
        decode_batch=best["batch_size"],
        extra=dict(
            build_s=build_s,
            batch_sizes=sizes,
            extrapolated=True,
            note=f"timed {new_tokens[0]} and {new_tokens[1]} new tokens per batch size, "
            f"extrapolated to {work.output_len}",
        ),
    )


def device_info(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"name": "cpu", "torch": torch.__version__}
    p = torch.cuda.get_device_properties(device)
    import triton

    return {
        "name": p.name,
        "sms": p.multi_processor_count,
        "memory_gb": p.total_memory / 1e9,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


def run_suite(
    plan: list[tuple[str, Workload]],
    model_dir: Path,
    device: torch.device,
    *,
    hf_batch_sizes: list[int] = (64, 256),
    hf_new_tokens: tuple[int, int] = (2, 4),
    budget_s: float | None = None,
    log=print,
    on_row=None,
    host_warm: bool = False,
) -> dict:
    """Run `plan` rows in order: ("multilora" | "base" | "eager" | "hf" | "dora", workload). Returns the report dict
    (device, measured bandwidth, rows, failed / not-run rows, target ratios). `on_row(report)` is called after
    each row, so a partial report survives a later failure or time limit; with `budget_s`, rows that would
    start after that many seconds are listed under "not_run" instead."""
    from multilora_cli.bench.report import target_ratios
    from multilora_cli.bench.sweep import slot_sweep

    t_start = time.perf_counter()
    bw = measure_bandwidth(device)
    flops = measure_matmul_flops(device)
    log(
        f"device {device_info(device)['name']}: copy bandwidth {bw / 1e12:.2f} TB/s (read + write), "
        f"matmul {flops / 1e12:.0f} TFLOP/s"
    )
    report = {
        "device": device_info(device),
        "bandwidth_tbs": bw / 1e12,
        "matmul_tflops": flops / 1e12,
        "rows": [],
        "failed": [],
        "not_run": [],
    }
    for i, (kind, work) in enumerate(plan):
        if budget_s is not None and time.perf_counter() - t_start > budget_s:
            report["not_run"] = [{"kind": k, "workload": w.to_dict()} for k, w in plan[i:]]
            log(f"  time budget spent: {len(plan) - i} rows not run")
            break
        try:
            if kind == "hf":
                row = run_hf_row(
                    work, model_dir, device, batch_sizes=list(hf_batch_sizes), new_tokens=hf_new_tokens, log=log
                )
            else:
                row = run_multilora_row(
                    work,
                    model_dir,
                    device,
                    bandwidth=bw,
                    flops=flops,
                    base_only=kind == "base",
                    enforce_eager=kind == "eager",
                    host_warm=host_warm,
                    dora=kind == "dora",
                    log=log,
                )
            report["rows"].append(row.to_dict())
        except Exception as e:  # noqa: BLE001 - keep the rows already measured; say what failed
            log(f"  {kind} {work.num_adapters} adapters FAILED: {type(e).__name__}: {e}")
            report["failed"].append({"kind": kind, "workload": work.to_dict(), "error": f"{type(e).__name__}: {e}"})
            _free(device)
        report["targets"] = target_ratios(report["rows"])
        report["slot_sweep"] = slot_sweep(report["rows"])
        if on_row is not None:
            on_row(report)
    report["targets"] = target_ratios(report["rows"])
    report["slot_sweep"] = slot_sweep(report["rows"])
    return report
