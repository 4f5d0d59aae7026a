"""Setting up a `multilora run` before any line is read: pre-flight of the adapters (+ base model), and the
engine config it implies (the GPU slot count when --max-loras is not given: engine/slot_budget.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from multilora_cli.config import EngineConfig, LineKind
from multilora_cli.run.config import RunConfig


def note(msg: str, quiet: bool = False) -> None:
    """One `multilora: ...` line on stderr."""
    if not quiet and sys.stderr is not None:  # None (stderr closed): print() would write to stdout instead
        print(f"multilora: {msg}", file=sys.stderr, flush=True)


def preflight_run(cfg: RunConfig):
    """adapters.preflight.Preflight of the run; each adapter that failed gets a one-line warning."""
    from multilora_cli.adapters.preflight import parse_adapter_specs, preflight

    specs = parse_adapter_specs(cfg.adapters, cfg.adapter_dir)
    pf = preflight(
        specs,
        cfg.model,
        max_loras=cfg.max_loras,
        max_lora_rank=cfg.max_lora_rank,
        fp8=cfg.engine.quantization == "fp8",
    )
    for name, err in pf.errors.items():
        note(f"warning: adapter {name!r} failed pre-flight; lines naming it get error records: {why(name, err)}")
    for w in pf.warnings:
        note(f"warning: {w}")
    return pf


def slot_choice(cfg: RunConfig, pf, n_adapters: int, econf: EngineConfig):
    """engine/slot_budget.SlotChoice of the run: --max-loras, else the memory and input rule on a GPU (slots of
    pre-flight's largest rank, a KV reserve for `econf`'s max_num_seqs at its max_model_len capped), the CPU
    default on CPU."""
    from multilora_cli.engine.slot_budget import (
        SlotInputs,
        choose_max_loras,
        reserve_context,
        slot_bytes,
        spare_gpu_bytes,
    )

    if cfg.max_loras is not None:
        return choose_max_loras(SlotInputs(n_adapters, 0, None), given=pf.max_loras)
    eng, mc = cfg.engine, pf.model_config
    fp8 = eng.quantization == "fp8" or mc.quantization is not None  # FP8 base: more room for slots
    spare = spare_gpu_bytes(eng.device, mc, eng.itemsize, eng.gpu_memory_utilization, fp8=fp8)  # None: CPU
    one = slot_bytes(mc, pf.max_lora_rank, eng.itemsize)
    if spare is not None and any(s.config.use_dora for s in pf.scans.values()):  # DoRA's fp32 rows in every slot
        from multilora_cli.adapters.costs import dora_slot_bytes

        one += dora_slot_bytes(mc)
    if spare is not None:  # embed_tokens / lm_head adapters (layers/vocab_lora.py): their slots and copies too
        from multilora_cli.adapters.costs import vocab_slot_bytes

        one += vocab_slot_bytes(mc, [s.vocab for s in pf.scans.values()], pf.max_lora_rank, eng.itemsize)
    return choose_max_loras(
        SlotInputs(
            adapters=n_adapters,
            one_slot=one,
            spare=spare,
            max_num_seqs=econf.max_num_seqs,
            context=reserve_context(econf.max_model_len, mc.max_position_embeddings),
            kv_token=mc.kv_bytes_per_token(eng.itemsize),
            kv_cap=_kv_cap(econf, mc, eng.itemsize),
        )
    )


def _kv_cap(econf: EngineConfig, mc, itemsize: int) -> int | None:
    """KV bytes the run's input can ever use (the runner's cap on its KV cache, engine/runner_sizing.py), or None
    when the input does not bound it (stdin)."""
    from multilora_cli.engine.runner_sizing import input_kv_blocks, window_kv_blocks

    blocks = input_kv_blocks(econf, mc.max_position_embeddings, window_kv_blocks(econf, mc))
    return None if blocks is None else blocks * econf.block_size * mc.kv_bytes_per_token(itemsize)


def engine_config(
    cfg: RunConfig,
    pf,
    good: dict[str, Path],
    line_kinds: frozenset[LineKind] | None = None,
    prompt_tokens: int | None = None,
):
    """(EngineConfig, SlotChoice) of a run whose adapters `good` passed pre-flight `pf`; the host cache sized by
    engine/host_budget.py (a warning on stderr when the adapters, or --max-cpu-loras, do not fit); a file input
    bounds the decode batches its CUDA graphs cover, its KV cache and the adapters its slots and host cache are
    sized for (io/reader.count_sequences), and a small one the prefill sizes the engine precompiles
    (`prompt_tokens`, the exact count, else io/reader.prompt_token_bound) and the sampler variants
    (`line_kinds`): run/line_kinds.py reads both off a small file."""
    from multilora_cli.engine.host_budget import choose_max_cpu_loras
    from multilora_cli.io.reader import count_sequences, prompt_token_bound

    econf = cfg.engine.engine_config(
        str(pf.model_path),
        max_loras=1,
        max_lora_rank=pf.max_lora_rank,
        seed=cfg.seed,
        max_decode_batch=count_sequences(cfg.input) or None,  # 0 (no line: nothing decodes) bounds nothing
        prompt_tokens_hint=prompt_tokens if prompt_tokens is not None else prompt_token_bound(cfg.input),
    )
    econf = replace(econf, line_kinds=line_kinds)
    # a line names one adapter: a file of L lines (each line's n counted) uses at most L of them, so slots, host
    # cache and page-locked arena are sized for the largest L, not for every adapter of an --adapter-dir
    used = len(good) if econf.max_decode_batch is None else min(len(good), econf.max_decode_batch)
    slots = slot_choice(cfg, pf, used, econf)
    sizes = sorted(packed_sizes(pf, good, cfg.engine.itemsize), reverse=True)[:used]
    if not sizes:  # no adapter (a base-only run): nothing to cache
        return replace(econf, max_loras=slots.max_loras), slots
    in_flight = min(slots.max_loras, econf.max_num_seqs)  # reads a wave ahead (SlotManager.read_ahead)
    host = choose_max_cpu_loras(sizes, in_flight, cfg.engine.max_cpu_loras)
    if host.warning:
        note(f"warning: {host.warning}", cfg.quiet)
    econf = replace(econf, max_loras=slots.max_loras, max_cpu_loras=max(host.max_cpu_loras, slots.max_loras))
    return econf, replace(slots, host_cache=host.reason)


def packed_sizes(pf, good: dict[str, Path], itemsize: int) -> list[int]:
    """Bytes of each good adapter packed in the run dtype, from pre-flight's header scans (no tensor read)."""
    out = []
    for name in good:
        scan = getattr(pf, "scans", {}).get(name)
        if scan is not None and scan.stored_dtype is not None:
            out.append(scan.stored_nbytes // scan.stored_dtype.itemsize * itemsize)
    return out


def why(name: str, err) -> str:
    """The pre-flight error without its leading "adapter 'x'" (the message around it names the adapter)."""
    text = err.one_line()
    for prefix in (f"adapter {name!r}: ", f"adapter {name!r} "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            if text.startswith("("):  # "(./path/adapter_config.json) uses DoRA" -> "./path/...: uses DoRA"
                inside, _, after = text[1:].partition(")")
                text = f"{inside}: {after.lstrip(': ')}"
            break
    return text
