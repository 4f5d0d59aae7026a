"""From a `Scenario` to a `Report`: adapter bytes, full-copy bytes, GPU memory, decode roofline, fleet, slots.

Each figure is recorded with the formula that produced it, its numbers filled in (see fleet.py and slots.py
for the models behind the throughput and hit-rate figures).
"""

from __future__ import annotations

from multilora_cli.adapters.costs import dora_slot_bytes
from multilora_cli.economics.comparable import not_comparable_message
from multilora_cli.economics.fleet import Hardware, Workload, ceil_div, plan_dedicated, plan_shared
from multilora_cli.economics.presets import HOURS_PER_MONTH
from multilora_cli.economics.report import Report, Section
from multilora_cli.economics.scenario import Resolved, Scenario, resolve
from multilora_cli.economics.slots import expected_distinct, lru_hit_rate, popularity
from multilora_cli.economics.units import n, pct, seconds, size, usd
from multilora_cli.models.quantization import base_bytes, projection_params


def compute(s: Scenario) -> Report:
    """Resolve `s` and work out every figure of the report."""
    return analyze(resolve(s))


def analyze(r: Resolved) -> Report:
    """Every figure of the report for an already resolved scenario (curves.py reuses one resolution per sweep)."""
    s = r.scenario
    cfg, ad, db, gpu = r.model.config, r.adapter, r.dtype_bytes, r.gpu

    # Adapter: r * (in + out) params per targeted module per layer --------------------------------------
    modules = [
        dict(
            module=m.module,
            in_features=m.in_features,
            out_features=m.out_features,
            rank=m.rank,
            layers=m.layers,
            params_per_layer=m.params_per_layer,
            params=m.params,
            bytes=m.params * db,
        )
        for m in ad.modules
    ]
    sa = Section("adapter", "Adapter size")
    groups: dict[str, list[str]] = {}  # identical terms printed once: "32×16×(4096+4096) ×4 (q,k,v,o)"
    for m in ad.modules:
        groups.setdefault(f"{m.layers}×{m.rank}×({m.in_features}+{m.out_features})", []).append(m.module)
    terms = " + ".join(t if len(ms) == 1 else f"{t} ×{len(ms)} ({','.join(ms)})" for t, ms in groups.items())
    a_params = sa.add("params", "LoRA parameters", ad.params, n(ad.params), f"Σ layers×r×(in+out) = {terms}")
    if ad.dora_params:  # DoRA: one magnitude per output feature of each adapted module, moved with A / B
        a_params += sa.add(
            "dora_params", "DoRA magnitude parameters", ad.dora_params, n(ad.dora_params), "Σ adapted out features"
        )
    if ad.full_params:  # modules_to_save copies of embed_tokens / lm_head: whole [V, H] weights
        a_params += sa.add(
            "full_params", "modules_to_save parameters", ad.full_params, n(ad.full_params), "V×H per copied module"
        )
    a_bytes = sa.add(
        "bytes", "bytes per adapter", a_params * db, size(a_params * db), f"{n(a_params)} params × {db} B ({s.dtype})"
    )

    # Full fine-tune copy ----------------------------------------------------------------------------------
    sc = Section("full_copy", "Full fine-tune copy vs adapter")
    emb = cfg.vocab_size * cfg.hidden_size
    b_params = sc.add(
        "base_params",
        "base model parameters",
        cfg.num_params(),
        n(cfg.num_params()),
        f"{cfg.num_hidden_layers} layers × (7 linears + norms) + embeddings "
        f"{cfg.vocab_size}×{cfg.hidden_size}{' (tied)' if cfg.tie_word_embeddings else ' ×2 (lm_head)'}",
    )
    if r.fp8:  # decoder projections 1 B + an fp32 scale per output channel; embeddings, norms, LM head at db
        proj = projection_params(cfg)
        copy_b = base_bytes(cfg, db, True)
        how = f"{n(proj)} projection params × 1 B (fp8) + {n(b_params - proj)} × {db} B + scales"
    else:
        copy_b, how = b_params * db, f"{n(b_params)} × {db} B"
    copy = sc.add("copy_bytes", "bytes per full copy", copy_b, size(copy_b), how)
    shrink = sc.add(
        "shrink_factor", "shrink factor", copy / a_bytes, f"{copy / a_bytes:,.1f}×", f"{size(copy)} / {size(a_bytes)}"
    )
    sc.add("adapter_fraction", "adapter / full copy", a_bytes / copy, pct(a_bytes / copy), f"1 / {shrink:,.1f}")

    # GPU memory -------------------------------------------------------------------------------------------
    hw = Hardware(gpu.memory_gb * 1e9, gpu.bandwidth_tbs * 1e12 * s.bandwidth_efficiency, s.kv_reserve)
    kvpt = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * db
    w_read = copy - (0 if cfg.tie_word_embeddings else emb * db)
    work = Workload(copy, w_read, kvpt, s.context_len, s.batch_size)
    pop = popularity(s.tenants, s.popularity, s.zipf_s)

    def distinct(batch: int) -> float:  # adapters read per step: distinct tenants in the batch, <= slots
        return min(float(r.max_loras), expected_distinct(pop, batch))

    measured = r.stats.completion_tokens_per_second if r.stats else None
    # a run of another model, dtype or device says nothing about this fleet's tokens/s (comparable.py)
    sizes = measured if r.comparable and r.comparable.ok else None
    shared = plan_shared(s.tenants, s.tokens_per_tenant_per_s, work, hw, a_bytes, distinct, sizes)
    ded = plan_dedicated(s.tenants, s.tokens_per_tenant_per_s, work, hw)
    g = shared.gpus_per_replica
    sm = Section("memory", f"GPU memory ({gpu.name}, one replica = {g} GPU{'s' * (g > 1)})")
    budget = sm.add(
        "weight_budget_bytes",
        "weight budget per replica",
        g * hw.memory * (1 - s.kv_reserve),
        size(g * hw.memory * (1 - s.kv_reserve)),
        f"{g} × {gpu.memory_gb:g} GB × (1 − {s.kv_reserve:g} KV reserve)",
    )
    sm.add(
        "gpus_per_replica",
        "GPUs holding one base copy",
        g,
        n(g),
        f"ceil({size(copy)} / {size(hw.memory * (1 - s.kv_reserve))} per GPU)",
    )
    sm.add(
        "adapters_fit",
        "adapters resident beside the base",
        shared.adapters_fit,
        n(shared.adapters_fit),
        f"floor(({size(budget)} − {size(copy)} base) / {size(a_bytes)})",
    )
    slot_bytes = sum(ad.max_rank * (m.in_features + m.out_features) * m.layers for m in ad.modules) * db
    if ad.dora_params:  # float32 scale rows per slot, every LoRA module (adapters/costs.py)
        slot_bytes += dora_slot_bytes(cfg)
    slot_bytes += ad.full_params * db  # modules_to_save copies: one per slot holding the adapter
    sm.add(
        "slot_bytes",
        f"{r.max_loras} GPU slots (at rank {ad.max_rank})",
        r.max_loras * slot_bytes,
        size(r.max_loras * slot_bytes),
        f"{r.max_loras} × {size(slot_bytes)}",
    )
    kv_budget = sm.add(
        "kv_reserve_bytes",
        "KV reserve per replica",
        g * hw.memory * s.kv_reserve,
        size(g * hw.memory * s.kv_reserve),
        f"{g} × {gpu.memory_gb:g} GB × {s.kv_reserve:g}",
    )
    sm.add(
        "kv_bytes_per_token",
        "KV bytes per token",
        kvpt,
        size(kvpt),
        f"2 (K,V) × {cfg.num_hidden_layers} layers × {cfg.num_key_value_heads} kv heads × {cfg.head_dim} × {db} B",
    )
    fit_seqs = int(kv_budget // (s.context_len * kvpt))
    sm.add(
        "sequences_fit",
        f"sequences of {s.context_len} tokens in the KV reserve",
        fit_seqs,
        n(fit_seqs),
        f"floor({size(kv_budget)} / ({s.context_len} × {size(kvpt)}))",
    )

    # Decode roofline --------------------------------------------------------------------------------------
    st = Section("throughput", "Decode throughput per replica (memory-bandwidth roofline)")
    st.add("batch", "decode batch", shared.batch, n(shared.batch), f"min({s.batch_size} --batch-size, {fit_seqs} fit)")
    st.add(
        "weights_read_bytes",
        "base weights read per step",
        w_read,
        size(w_read),
        "full copy" + ("" if cfg.tie_word_embeddings else f" − input embedding ({size(emb * db)}, only gathered)"),
    )
    st.add(
        "adapters_per_step",
        "distinct adapters read per step",
        shared.distinct_per_step,
        n(shared.distinct_per_step),
        f"min({r.max_loras} slots, Σ 1−(1−p_i)^{shared.batch} over tenants)",
    )
    st.add(
        "adapter_read_bytes",
        "adapter bytes read per step",
        shared.distinct_per_step * a_bytes,
        size(shared.distinct_per_step * a_bytes),
        "read once per step each (rank-aware SGMV)",
    )
    kv_read = shared.batch * s.context_len * kvpt
    st.add(
        "kv_read_bytes", "KV read per step", kv_read, size(kv_read), f"{shared.batch} × {s.context_len} × {size(kvpt)}"
    )
    st.add(
        "step_seconds",
        "decode step",
        shared.step_seconds,
        seconds(shared.step_seconds),
        f"bytes read / ({g} × {gpu.bandwidth_tbs:g} TB/s × {s.bandwidth_efficiency:g})",
    )
    st.add(
        "tokens_per_s_roofline",
        "shared: generated tok/s (roofline)",
        shared.tokens_per_s_roofline,
        n(round(shared.tokens_per_s_roofline)),
        f"{shared.batch} / {seconds(shared.step_seconds)}",
    )
    if r.stats:
        st.add(
            "tokens_per_s_measured",
            "shared: generated tok/s (measured)",
            measured,
            n(round(measured, 1)),
            f"completion_tokens_per_second of {r.stats.path} (prefill time included)"
            + (f" / {r.stats.workers} data-parallel workers" if r.stats.workers > 1 else "")
            + ("" if sizes else f" on {r.stats.device or '?'}: not comparable, shown only"),
        )
        if sizes:  # a ratio against another model's or device's roofline would mean nothing
            st.add(
                "measured_vs_roofline",
                "measured / roofline",
                measured / shared.tokens_per_s_roofline,
                pct(measured / shared.tokens_per_s_roofline),
                "how far this engine and device are from the model",
            )
        st.add(
            "measured_used_for_sizing",
            "measured tok/s used for sizing",
            bool(sizes),
            "yes" if sizes else "no",
            "same model shape, dtype and GPU" if sizes else "; ".join(r.comparable.reasons),
        )
    st.add(
        "tokens_per_s",
        "shared: tok/s used for sizing",
        shared.tokens_per_s,
        n(round(shared.tokens_per_s, 1)),
        "measured (--stats)" if sizes else "roofline" + (" (--stats not comparable)" if r.stats else ""),
    )
    st.add(
        "dedicated_batch_per_copy",
        "dedicated: batch per copy",
        ded.batch_per_copy,
        n(ded.batch_per_copy),
        f"KV reserve split over {ded.copies_per_gpu} cop{'ies' if ded.copies_per_gpu > 1 else 'y'} per GPU",
    )
    st.add(
        "dedicated_tokens_per_s_per_copy",
        "dedicated: tok/s per copy (roofline)",
        ded.tokens_per_s_per_copy,
        n(round(ded.tokens_per_s_per_copy)),
        f"{ded.batch_per_copy} / ({ded.copies_per_gpu} copies taking turns × step of own weights + KV)",
    )

    fleet = _fleet(s, r, ded, shared, a_bytes)
    slots = _slots(s, r, shared, a_bytes, slot_bytes)
    report = Report(r.assumptions, modules, [sa, sc, sm, st, fleet, slots])
    _warn(report, s, r, shared, slot_bytes, a_bytes)
    saved, saved_usd = fleet["gpus_saved"], fleet["usd_per_month_saved"]
    # shared can need more GPUs than dedicated (a few tenants with high demand: it also reads adapters each step)
    outcome = (
        f"{n(saved)} saved = {usd(saved_usd)}/month"
        if saved >= 0
        else f"{n(-saved)} more for shared = {usd(-saved_usd)}/month more"
    )
    report.summary = (
        f"{n(s.tenants)} tenant{'' if s.tenants == 1 else 's'} on {r.model.label} with {size(a_bytes)} adapters "
        f"({shrink:,.0f}× smaller than a full copy): {n(fleet['dedicated_gpus'])} dedicated vs "
        f"{n(fleet['shared_gpus'])} shared {gpu.name} GPUs, {outcome}"
    )
    return report


def _fleet(s: Scenario, r: Resolved, ded, shared, a_bytes: float) -> Section:
    f = Section("fleet", "Fleet: dedicated full copies vs one shared base")
    hour, tenants, d = r.gpu.hour_usd, s.tenants, s.tokens_per_tenant_per_s
    demand = f.add(
        "demand_tokens_per_s",
        "total demand",
        tenants * d,
        f"{n(tenants * d)} tok/s",
        f"{n(tenants)} tenants × {n(d)} tok/s",
    )
    f.add(
        "dedicated_copies_per_gpu_by_memory",
        "dedicated: copies per GPU by memory",
        ded.copies_per_gpu_by_memory,
        n(ded.copies_per_gpu_by_memory),
        "floor(weight budget / full copy)"
        if ded.gpus_per_replica == 1
        else f"a copy needs {ded.gpus_per_replica} GPUs",
    )
    f.add(
        "dedicated_gpus_by_memory",
        "dedicated: GPUs by memory",
        ded.gpus_by_memory,
        n(ded.gpus_by_memory),
        f"ceil({n(tenants)} / {ded.copies_per_gpu_by_memory}) × {ded.gpus_per_replica}",
    )
    f.add(
        "dedicated_copies_per_gpu",
        "dedicated: copies per GPU meeting demand",
        ded.copies_per_gpu,
        n(ded.copies_per_gpu),
        f"most copies per GPU that still serve {n(d)} tok/s each "
        f"({n(round(ded.tokens_per_s_per_copy))} tok/s per copy)",
    )
    f.add(
        "dedicated_copies_per_tenant",
        "dedicated: copies per tenant",
        ded.copies_per_tenant,
        n(ded.copies_per_tenant),
        f"ceil({n(d)} / {n(round(ded.tokens_per_s_per_copy))})"
        if ded.copies_per_tenant > 1
        else "one copy meets the demand",
    )
    ded_gpus = f.add(
        "dedicated_gpus",
        "dedicated: GPUs",
        ded.gpus,
        n(ded.gpus),
        "max of the memory and throughput bounds, copies packed per GPU",
    )
    f.add(
        "dedicated_gpus_unpacked",
        "dedicated: GPUs, one per copy (no packing)",
        ded.gpus_unpacked,
        n(ded.gpus_unpacked),
        f"{n(tenants)} × {ded.copies_per_tenant} × {ded.gpus_per_replica}",
    )
    f.add(
        "shared_replicas_by_memory",
        "shared: replicas by memory (all adapters resident)",
        shared.replicas_by_memory,
        n(shared.replicas_by_memory),
        f"ceil({n(tenants)} / {n(shared.adapters_fit)} adapters per replica)",
    )
    f.add(
        "shared_replicas_by_throughput",
        "shared: replicas by throughput",
        shared.replicas_by_throughput,
        n(shared.replicas_by_throughput),
        f"ceil({n(demand)} / {n(round(shared.tokens_per_s, 1))} tok/s)",
    )
    sh_gpus = f.add(
        "shared_gpus",
        "shared: GPUs",
        shared.gpus,
        n(shared.gpus),
        f"max(replicas) × {shared.gpus_per_replica} GPU/replica; {shared.bound}-bound",
    )
    f.add("shared_bound", "shared: binding constraint", shared.bound, shared.bound)
    saved = f.add(
        "gpus_saved", "GPUs saved", ded_gpus - sh_gpus, n(ded_gpus - sh_gpus), f"{n(ded_gpus)} − {n(sh_gpus)}"
    )
    month = HOURS_PER_MONTH * hour
    f.add(
        "usd_per_month_dedicated",
        "dedicated $/month",
        ded_gpus * month,
        usd(ded_gpus * month),
        f"{n(ded_gpus)} × {usd(hour)}/h × {HOURS_PER_MONTH} h",
    )
    f.add(
        "usd_per_month_shared",
        "shared $/month",
        sh_gpus * month,
        usd(sh_gpus * month),
        f"{n(sh_gpus)} × {usd(hour)}/h × {HOURS_PER_MONTH} h",
    )
    f.add(
        "usd_per_month_saved",
        "saved $/month",
        saved * month,
        usd(saved * month),
        f"{n(saved)} GPUs × {usd(hour)}/h × {HOURS_PER_MONTH} h",
    )
    per_m = 1e6 / (demand * 3600)
    f.add(
        "usd_per_million_tokens_dedicated",
        "dedicated $ per 1M generated tokens",
        ded_gpus * hour * per_m,
        usd(ded_gpus * hour * per_m),
        "GPUs × $/h / (demand × 3600 s) × 1e6, at the stated demand",
    )
    f.add(
        "usd_per_million_tokens_shared",
        "shared $ per 1M generated tokens",
        sh_gpus * hour * per_m,
        usd(sh_gpus * hour * per_m),
        "same, shared GPUs",
    )
    return f


def _slots(s: Scenario, r: Resolved, shared, a_bytes: float, slot_bytes: float) -> Section:
    replicas = max(1, shared.gpus // shared.gpus_per_replica)
    t = ceil_div(s.tenants, replicas)  # tenants pinned to replicas (adapter-affine routing)
    f = Section("slots", f"Slot thrash: {r.max_loras} slots, {n(t)} tenants per replica, LRU")
    f.add(
        "tenants_per_replica",
        "tenants per replica",
        t,
        n(t),
        f"ceil({n(s.tenants)} / {replicas} replica{'s' * (replicas > 1)})",
    )
    pop = popularity(t, s.popularity, s.zipf_s)
    hit = lru_hit_rate(pop, r.max_loras)
    method = (
        "all tenants fit in the slots"
        if r.max_loras >= t
        else f"exact for uniform: {r.max_loras} / {n(t)}"
        if s.popularity == "uniform" or s.zipf_s == 0
        else f"Che approximation, zipf s={s.zipf_s:g}"
    )
    f.add("hit_rate", "slot hit rate (per new request)", hit, pct(hit), method)
    refs = r.requests_per_step if r.requests_per_step is not None else shared.batch / r.output_tokens
    f.add(
        "requests_per_step",
        "new requests per step",
        refs,
        n(refs),
        "--requests-per-step"
        if r.requests_per_step
        else f"batch {shared.batch} / {n(r.output_tokens)} generated tokens per request (steady state)",
    )
    loads = f.add(
        "loads_per_step", "slot loads per step", refs * (1 - hit), n(refs * (1 - hit)), f"{n(refs)} × (1 − {pct(hit)})"
    )
    f.add(
        "load_bytes_per_step",
        "load bytes per step",
        loads * a_bytes,
        size(loads * a_bytes),
        f"{n(loads)} × {size(a_bytes)}",
    )
    pcie = r.gpu.pcie_gbs * 1e9
    load_s = f.add(
        "load_seconds_per_step",
        "load time per step",
        loads * a_bytes / pcie,
        seconds(loads * a_bytes / pcie),
        f"at {r.gpu.pcie_gbs:g} GB/s host->GPU",
    )
    # step time is the device's and model's too: only a comparable run replaces the roofline's
    measured_step = r.stats.step_seconds if r.stats and r.comparable.ok else None
    step = measured_step or shared.step_seconds
    per_worker = f" per worker ({r.stats.workers} data parallel)" if measured_step and r.stats.workers > 1 else ""
    f.add(
        "step_seconds",
        "decode step",
        step,
        seconds(step),
        f"measured: generation seconds / engine steps{per_worker}"
        if measured_step
        else "roofline (throughput section)",
    )
    f.add(
        "load_share",
        "load time / step time",
        load_s / step,
        pct(load_s / step),
        "< 100%: loads can hide behind compute; > 100%: PCIe-bound thrash",
    )
    f.add(
        "full_turnover_seconds",
        f"replacing all {r.max_loras} slots",
        r.max_loras * slot_bytes / pcie,
        seconds(r.max_loras * slot_bytes / pcie),
        f"{r.max_loras} × {size(slot_bytes)} / {r.gpu.pcie_gbs:g} GB/s",
    )
    cap = step * pcie / (a_bytes * (1 - hit)) if hit < 1 else None
    f.add(
        "max_requests_per_step_pcie",
        "new requests per step PCIe can feed",
        cap,
        "unbounded (no misses)" if cap is None else n(cap),
        "step × PCIe / (adapter bytes × miss rate)",
    )
    f.add(
        "max_loads_per_step_pcie",
        "slot loads per step PCIe can feed",
        step * pcie / a_bytes,
        n(step * pcie / a_bytes),
        f"{seconds(step)} × {r.gpu.pcie_gbs:g} GB/s / {size(a_bytes)}",
    )
    if r.stats and r.stats.hit_rate is not None:
        f.add(
            "measured_hit_rate",
            "measured hit rate",
            r.stats.hit_rate,
            pct(r.stats.hit_rate),
            "slot_hits / (slot_hits + slot_loads)",
        )
    if r.stats and r.stats.loads_per_step is not None:
        f.add(
            "measured_loads_per_step",
            "measured loads per step",
            r.stats.loads_per_step,
            n(r.stats.loads_per_step),
            "slot_loads / steps",
        )
    return f


def _warn(report: Report, s: Scenario, r: Resolved, shared, slot_bytes: float, a_bytes: float) -> None:
    w = report.warnings
    if shared.gpus_per_replica > 1:
        w.append(
            f"{r.model.label} needs {shared.gpus_per_replica} {r.gpu.name} GPUs per copy; "
            "tensor parallel is assumed to scale memory and bandwidth ideally"
        )
    if r.max_loras * slot_bytes > shared.adapters_fit * a_bytes:
        w.append(f"{r.max_loras} slots ({size(r.max_loras * slot_bytes)}) exceed the memory left beside the base")
    if report.section("slots")["load_share"] > 1:
        w.append(
            "slot loads take longer than a decode step: PCIe-bound thrash; raise --max-loras or group "
            "requests by adapter"
        )
    if r.stats and not r.comparable.ok:
        w.append(not_comparable_message(r.stats, r.model, r.gpu, s.dtype, r.comparable))
    elif r.stats and r.comparable.reasons:
        w.append(
            f"--stats: {'; '.join(r.comparable.reasons)}: its measured throughput sizes the fleet "
            f"(pass the --gpu it ran on if it was not a {r.gpu.name})"
        )
