"""`read_packed`: a PEFT checkpoint read straight from its file into a packed arena block, in a handful of calls.

Why: adapters are read on prefetch threads beside the step loop. `load_adapter` + `pack_adapter` make ~2,700 torch
calls per Llama-3-8B adapter (get, isfinite, all, to, reshape per tensor). Each call lets go of the GIL and
must win it back from the step loop's thread, which holds it between its own torch calls: a pack that takes
~9 ms alone took 80 ms median inside a bench run. Here the header gives each
tensor's byte span (adapters/scan.py has validated everything but the values), `plan_pack` gives its place,
and one `os.preadv` per contiguous run of the file puts every tensor in its place, the GIL released once.
All of that but the bytes is a `ReadPlan`, which the engine makes for every adapter at start (`plan_read`, on
its own thread: ~3 ms of pure Python per Llama-3-8B adapter that would otherwise hold the GIL on a reader
thread while the step loop waits for it); a read then only checks the file is unchanged.

- Stored in the run dtype: read into the arena block itself. Another dtype: read into a scratch buffer the same
  way, then one converting copy into the block.
- NaN/Inf: one min/max pass over the values read (`scan.all_finite`); if it fails, each tensor is checked, in
  `load_adapter`'s order, to name the first bad one with `load_adapter`'s message.
- MoE expert LoRA (engine/packed_experts.py): PEFT's lora_A / lora_B are one span each per layer's parameter, as
  stored; per-expert modules one span per expert tensor (experts the checkpoint leaves out: zeroed in the block).
- None (the caller loads the usual way) for a .bin checkpoint, tensors of mixed dtypes, or a full arena.
The buffer is bit-identical to `pack_adapter(load_adapter(...))` (tests/engine/test_direct_read.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import Executor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from multilora_cli.adapters.experts import expert_specs
from multilora_cli.adapters.peft import read_vocab
from multilora_cli.adapters.scan import (
    AdapterScan,
    all_finite,
    nonfinite,
    read_magnitudes,
    scan_adapter,
    scan_ident,
)
from multilora_cli.adapters.tensors import narrows, out_of_range
from multilora_cli.engine.packed import PackedAdapter, PackPlan, fill_magnitudes, packed_adapter, plan_pack
from multilora_cli.errors import AdapterError
from multilora_cli.models.config import ModelConfig

IOV_MAX = 1024  # POSIX minimum of iovecs per preadv (Linux: 1024)
READ_CHUNK = 64 << 20  # bytes per piece a reader pool's thread copies (`read_spans`)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """Everything about one adapter's read but its bytes: validated metadata, layout, file spans (begin, end,
    destination byte), and the files' identity when scanned (`scan.ident`): a changed adapter is re-planned."""

    scan: AdapterScan
    plan: PackPlan
    spans: tuple[tuple[int, int, int], ...]
    stored: torch.dtype
    dtype: torch.dtype
    ident: tuple | None
    # DoRA: the magnitudes' file spans (begin, end, byte offset in a scratch of mag_dtype, in `plan.mags` order);
    # mag_dtype None: read tensor by tensor (`read_magnitudes`: mixed dtypes, or none)
    mag_spans: tuple[tuple[int, int, int], ...] = ()
    mag_dtype: torch.dtype | None = None
    zeros: tuple[tuple[int, int], ...] = ()  # element ranges [begin, end) no span fills (left-out experts)
    # `plan.layout(dtype)`, made once here (at start) rather than per read: ~70 tuples an adapter that the host
    # cache kept, the GC's young work and its older generations' (1,000 adapters: ~70k of them; issue 38)
    layout: tuple = ()

    @property
    def nbytes(self) -> int:
        return self.plan.total * self.dtype.itemsize


def plan_read(
    path: Path, name: str, model_config: ModelConfig | None, dtype: torch.dtype, scan: AdapterScan | None = None
) -> ReadPlan | None:
    """Validate the adapter in folder `path` from its config and header (raises `load_adapter`'s errors) and
    plan its read in `dtype`; None where this path does not apply (.bin, mixed dtypes). `scan`: its
    `scan_adapter` from earlier (pre-flight's), used instead of a second scan."""
    if scan is None:
        scan = scan_adapter(path, name, model_config)
    tf = scan.tensors
    if not scan.modules and not scan.expert_keys:  # embed_tokens / lm_head only (adapters/vocab.py): nothing to pack
        return None
    first = next(iter(scan.modules.values())).key_a if scan.modules else scan.expert_keys[0]
    if tf.span(first) is None:
        return None  # .bin: torch.load has it in memory already
    stored = {d for m in scan.modules.values() for d in (m.dtype_a, m.dtype_b)} | {
        tf.dtype(k) for k in scan.expert_keys
    }
    if len(stored) != 1:
        return None
    fdtype = stored.pop()
    especs = scan.expert_specs
    if scan.expert_keys and not especs:  # scanned without a MoE base: expert_specs says why it cannot load
        especs = expert_specs(tf, scan.expert_keys, scan.config, model_config, name)
    plan = plan_pack(
        {k: (m.rank, m.in_features, m.out_features, m.scaling) for k, m in scan.modules.items()},
        [k for k, m in scan.modules.items() if m.key_m is not None],  # DoRA: magnitudes packed after A / B
        {
            k: (
                model_config.moe.num_experts,
                s.rank,
                s.in_features,
                s.out_features,
                s.scaling,
                s.param is not None,
                s.part == "up" and s.param is not None and (k[0], "gate") in especs,
            )
            for k, s in especs.items()
        },
    )
    spans = []
    for key, ab, off in plan.order:
        spec = scan.modules[key]
        begin, end = tf.span(spec.key_a if ab == "a" else spec.key_b)
        if ab == "b" and spec.b_rows is not None:  # a fused module's slice: its rows of lora_B [out, r]
            row = spec.rank * fdtype.itemsize
            begin, end = begin + spec.b_rows[0] * row, begin + spec.b_rows[1] * row
        spans.append((begin, end, off * fdtype.itemsize))
    espans, zeros = _expert_spans(tf, especs, plan, fdtype.itemsize)
    spans += espans
    mdtypes = {tf.dtype(scan.modules[k].key_m) for k, _, _ in plan.mags}
    mdtype = mdtypes.pop() if len(mdtypes) == 1 else None
    mspans = []
    for key, off, _ in plan.mags if mdtype is not None else ():
        spec = scan.modules[key]
        begin, end = tf.span(spec.key_m)
        if spec.b_rows is not None:  # a fused module's slice: its rows of the magnitude vector
            begin, end = begin + spec.b_rows[0] * mdtype.itemsize, begin + spec.b_rows[1] * mdtype.itemsize
        mspans.append((begin, end, off * mdtype.itemsize))
    return ReadPlan(
        scan, plan, tuple(sorted(spans)), fdtype, dtype, scan.ident, tuple(mspans), mdtype, zeros, plan.layout(dtype)
    )


def _expert_spans(tf, specs: dict, plan: PackPlan, isz: int):
    """File spans (begin, end, destination byte) of the expert LoRA tensors in `plan`'s places, and the element
    ranges no span fills (experts a per-expert-module checkpoint leaves out)."""
    spans, zeros, done_a = [], [], set()
    for p in plan.experts:
        s = specs[(p.layer, p.part)]
        if s.param is not None:
            ka, kb, lo, hi = s.param
            if p.a_off not in done_a:  # gate and up share PEFT's gate_up_proj A
                begin, end = tf.span(ka)
                spans.append((begin, end, p.a_off * isz))
            begin, _ = tf.span(kb)
            row = p.rank * p.experts * isz  # lora_B [out_total, r * E]: the part's rows lo..hi
            spans.append((begin + lo * row, begin + hi * row, p.b_off * isz))
        else:
            a_each, b_each = p.rank * p.in_features, p.out_features * p.rank
            have = set()
            for e, ka, kb in s.per_expert:
                have.add(e)
                spans.append((*tf.span(ka), (p.a_off + e * a_each) * isz))
                spans.append((*tf.span(kb), (p.b_off + e * b_each) * isz))
            for e in sorted(set(range(p.experts)) - have):
                zeros += [(p.a_off + e * a_each, p.a_off + (e + 1) * a_each)]
                zeros += [(p.b_off + e * b_each, p.b_off + (e + 1) * b_each)]
        done_a.add(p.a_off)
    merged: list[tuple[int, int]] = []  # back-to-back ranges as one (runs of left-out experts: one zero_ each)
    for begin, end in sorted(zeros):
        if merged and merged[-1][1] == begin:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((begin, end))
    return spans, tuple(merged)


def read_packed(
    path: Path,
    name: str,
    model_config: ModelConfig | None,
    dtype: torch.dtype,
    arena,
    planned: ReadPlan | None = None,
    *,
    pageable: bool = False,
    readers: Executor | None = None,
    check: bool = True,
) -> PackedAdapter | None:
    """The adapter in folder `path` packed into a block of `arena` (engine/pinned.PinnedArena) in `dtype`,
    validated as `load_adapter` validates it (raises the same errors); None where this path does not apply.
    `planned`: its `plan_read` from earlier (the engine plans every adapter at start, on its own thread); used
    unless the file changed since. `pageable`: when `arena` is None or full, read into a fresh pageable buffer
    instead of giving None (what `pack_adapter(load_adapter(...))` would make, without its ~3 copies and
    thousands of torch calls: a MoE adapter is ~1.3 GB and the arena holds a few dozen). `readers`: a thread
    pool that reads the file's pieces in parallel (`read_spans`). `check=False`: A / B are not checked for NaN / Inf
    here (the packed adapter comes back `unchecked`: a CUDA slot load checks its device copy, engine/slot_writer.py),
    unless it has DoRA magnitudes (their norms read A / B at the load) or is stored in another dtype: those are
    checked here as before."""
    rp = planned
    if rp is None or rp.dtype != dtype or rp.ident is None or scan_ident(rp.scan) != rp.ident:
        rp = plan_read(path, name, model_config, dtype)
        if rp is None:
            return None
    block = arena.alloc(rp.nbytes) if arena is not None else None
    if block is None and not pageable:
        return None
    try:
        flat = block.tensor(rp.plan.total, dtype) if block is not None else torch.empty(rp.plan.total, dtype=dtype)
        ab = rp.plan.ab_total  # A / B blocks; the DoRA magnitudes follow them
        if rp.stored == dtype:
            mem = block.memoryview() if block is not None else memoryview(flat.view(torch.uint8).numpy())
            values, target = flat[:ab], mem
        else:
            values = torch.empty(ab, dtype=rp.stored)
            target = memoryview(values.view(torch.uint8).numpy())
        for begin, end in rp.zeros:
            values[begin:end].zero_()
        read_spans(rp.scan.weights_path, target, rp.spans, rp.scan, readers)
        # (a converting read is checked here: the device would see the converted values, an overflow as Inf)
        unchecked = not check and not rp.plan.mags and rp.stored == dtype
        if not unchecked:
            check_finite(values, rp.plan, rp.scan)
        if rp.stored != dtype:
            flat[:ab].copy_(values)
            if narrows(rp.stored, dtype):  # float16: a finite value past 65,504 would be served as Inf
                check_range(flat[:ab], rp.plan, rp.scan, dtype)
        magnitudes = _read_magnitudes(rp, flat)
        # embed_tokens / lm_head LoRA and copies (adapters/vocab.py): vocabulary-sized, never in the slots' layout
        vocab = read_vocab(rp.scan.tensors, rp.scan.vocab, dtype, name, rp.scan.weights_path)
    except BaseException:
        if block is not None:
            arena.release(block)
        raise
    packed = packed_adapter(rp.scan, flat, rp.plan, block, arena, layout=rp.layout)
    packed.magnitudes = magnitudes
    packed.vocab = vocab
    packed.unchecked = unchecked
    return packed


def _read_magnitudes(rp: ReadPlan, flat: torch.Tensor) -> dict:
    """DoRA: the magnitudes packed behind A / B in `flat` (float32), as views of it ({} for a plain LoRA). One
    preadv into a scratch vector, one finiteness pass and one converting copy, rather than ~4 torch calls per
    module on this reader thread (each one a GIL hand-off with the step loop); a non-finite value is named by
    `read_magnitudes`, which reads them tensor by tensor as `load_adapter` does."""
    plan = rp.plan
    if not plan.mags:
        return {}
    if rp.mag_dtype is not None:
        scratch = torch.empty(plan.mag_floats, dtype=rp.mag_dtype)
        read_spans(rp.scan.weights_path, memoryview(scratch.view(torch.uint8).numpy()), rp.mag_spans, rp.scan)
        if all_finite(scratch):
            return fill_magnitudes(flat, plan, scratch)
    return fill_magnitudes(flat, plan, read_magnitudes(rp.scan))  # raises the NaN / Inf error


def read_spans(
    file: Path,
    target: memoryview,
    spans: Iterable[tuple[int, int, int]],
    scan: AdapterScan,
    readers: Executor | None = None,
    chunk: int = READ_CHUNK,
) -> None:
    """Copy file bytes [begin, end) to target[dst:] for each (begin, end, dst): one preadv per run of spans
    that are back to back in the file (a PEFT checkpoint is one run). `readers`: a pool that reads pieces of
    about `chunk` bytes in parallel (one thread copies the page cache at a fraction of the host's bandwidth: a
    MoE adapter is ~1.7 GB and a wave needs a dozen of them); the caller's thread waits for all of them."""
    spans = sorted(spans)  # by file offset
    fd = os.open(file, os.O_RDONLY)
    try:
        pieces = _pieces(spans, chunk if readers is not None else None)
        if readers is None or len(pieces) < 2:
            for piece in pieces:
                _read_run(fd, target, piece, file, scan)
            return
        futures = [readers.submit(_read_run, fd, target, piece, file, scan) for piece in pieces]
        wait(futures)  # every read done before the fd closes, even when one failed
        for f in futures:
            f.result()  # the first failure, raised
    finally:
        os.close(fd)


def _pieces(spans: list[tuple[int, int, int]], chunk: int | None) -> list[list[tuple[int, int, int]]]:
    """Sorted spans as runs for one preadv each: back to back in the file, at most IOV_MAX spans, and (with
    `chunk`) at most `chunk` bytes, a longer span split across runs."""
    out: list[list[tuple[int, int, int]]] = []
    run: list[tuple[int, int, int]] = []
    size = 0
    for begin, end, dst in spans:
        while begin < end:
            if run and (run[-1][1] != begin or len(run) >= IOV_MAX or (chunk is not None and size >= chunk)):
                out.append(run)
                run, size = [], 0
            stop = end if chunk is None else min(end, begin + chunk - size)
            run.append((begin, stop, dst))
            size += stop - begin
            dst += stop - begin
            begin = stop
    if run:
        out.append(run)
    return out


def _read_run(fd: int, target: memoryview, run: list[tuple[int, int, int]], file: Path, scan: AdapterScan) -> None:
    """One run of back-to-back spans: preadv until every buffer is full (a short read resumes in the rest)."""
    bufs = [target[d : d + e - b] for b, e, d in run]
    pos = run[0][0]
    while bufs:
        n = os.preadv(fd, bufs, pos)
        if n <= 0:
            raise AdapterError(
                f"adapter {scan.name!r}: {file} ended at byte {pos} while reading its tensors (changed on disk?)",
                hint="re-download or re-save the adapter",
            )
        pos += n
        while bufs and n >= len(bufs[0]):  # drop what is full, resume in the rest
            n -= len(bufs[0])
            bufs.pop(0)
        if n:
            bufs[0] = bufs[0][n:]


def check_range(values: torch.Tensor, plan: PackPlan, scan: AdapterScan, dtype: torch.dtype) -> None:
    """Raise `load_adapter`'s error for the first (module, A/B) whose values, converted to `dtype`, overflowed
    (`values`: the converted A / B blocks, finite as read)."""
    where = f"adapter {scan.name!r}: {scan.weights_path}"
    _first_bad(
        values,
        plan,
        scan,
        lambda module, ab: out_of_range(f"{where}: {module}: lora_{ab}", dtype),
        lambda layer: out_of_range(f"{where}: expert LoRA of layer {layer}", dtype),
    )


def check_finite(values: torch.Tensor, plan: PackPlan, scan: AdapterScan) -> None:
    """Raise `load_adapter`'s NaN/Inf error for the first (module, A/B) holding one."""
    _first_bad(
        values,
        plan,
        scan,
        lambda module, ab: nonfinite(scan.name, scan.weights_path, module, ab),
        lambda layer: AdapterError(  # as adapters/experts.load_experts names it
            f"adapter {scan.name!r}: {scan.weights_path}: expert LoRA of layer {layer} contains NaN or Inf values"
        ),
    )


def _first_bad(values: torch.Tensor, plan: PackPlan, scan: AdapterScan, module_error, expert_error) -> None:
    """Raise `module_error(module name, "A" | "B")` or `expert_error(layer)` for the first block of `values` (packed
    A / B, `plan`'s layout) that holds a NaN or Inf; nothing if none does (one pass first, blocks only then)."""
    if all_finite(values):
        return
    for key, spec in scan.modules.items():
        a_off, b_off = plan.where[key][2:]
        for ab, off, numel in (("A", a_off, spec.rank * spec.in_features), ("B", b_off, spec.out_features * spec.rank)):
            if not all_finite(values[off : off + numel]):
                raise module_error(scan.module_names[key], ab)
    for p in plan.experts:
        a, b = values[p.a_off : p.a_off + p.a_numel], values[p.b_off : p.b_off + p.b_numel]
        if not (all_finite(a) and all_finite(b)):
            raise expert_error(p.layer)
