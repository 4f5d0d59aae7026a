"""Slot loads on CUDA (skipped without a GPU): packed DoRA adapters from the page-locked arena give PEFT's norms
(fp32: to float32 rounding; bf16 slots: close), through the load stream; a load into a free slot runs beside the
step on the compute stream, one into an evicted slot waits for the steps enqueued before the eviction, and the
compute stream waits for a load only before what reads its slot (`wait_for`: a step's slots, a clear)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.engine.packed import pack_adapter
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model
from tests.builders import build_adapter, build_base
from tests.engine.test_dora_loads import KINDS, _reference, _rows

pytestmark = pytest.mark.gpu
SLEEP = 2_000_000_000  # cycles of torch.cuda._sleep: ~1 s, far longer than enqueueing a load


def _setup(tmp_path, dtype):
    base = build_base(tmp_path / "base", "llama")
    cfg = ModelConfig.from_dir(base)
    adapters = {n: load_adapter(build_adapter(base, tmp_path / n, **kw), n, cfg) for n, kw in KINDS.items()}
    cpu = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=3, max_lora_rank=8)
    model = load_model(base, cfg, dtype=dtype, device="cuda", max_loras=3, max_lora_rank=8)
    writer = SlotWriter(model.lora_modules(), torch.device("cuda"))
    writer.enable_dora()
    arena = PinnedArena(64 << 20, cuda=True)
    packed = {n: pack_adapter(a, pin=False, dtype=dtype, arena=arena) for n, a in adapters.items()}
    return cpu, model, writer, adapters, packed


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_packed_dora_loads_on_cuda_are_peft_norms(tmp_path, dtype, tol):
    cpu, model, writer, adapters, packed = _setup(tmp_path, dtype)
    want = {n: _reference(cpu, adapters[n]) for n in ("dora_all", "dora_some")}
    writer.install(0, packed["plain"])
    writer.install(0, packed["dora_all"])  # over a rank-8 slot: stale rows past rank 4
    writer.install(1, packed["dora_some"])
    writer.clear(1)
    writer.install(1, packed["dora_some"])  # evicted and reloaded
    writer.wait_all()  # (a step waits for its own slots' loads)
    torch.testing.assert_close(_rows(model, 0).cpu(), want["dora_all"], atol=tol, rtol=tol)
    torch.testing.assert_close(_rows(model, 1).cpu(), want["dora_some"], atol=tol, rtol=tol)


def test_load_stream_overlaps_free_slots_and_waits_for_evicted_ones(tmp_path):
    _, model, writer, _, packed = _setup(tmp_path, torch.float32)
    writer.install(0, packed["dora_all"])  # warm: Triton compile, cached plans and indexes, allocator pools
    writer.install(1, packed["dora_some"])
    torch.cuda.synchronize()
    compute = torch.cuda.current_stream()
    torch.cuda._sleep(SLEEP)  # a long "step" on the compute stream
    writer.install(2, packed["dora_some"])  # a free slot: nothing to wait for
    writer.stream.synchronize()  # the load ran while the step is still running
    assert not compute.query()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP)  # a step that may still read slot 0
    writer.clear(0)
    writer.install(0, packed["dora_some"])
    assert not writer.stream.query()  # the load waits for that step
    torch.cuda.synchronize()
    torch.testing.assert_close(_rows(model, 0), _rows(model, 2), atol=0, rtol=0)


def test_a_step_waits_only_for_the_loads_into_its_own_slots(tmp_path):
    """Issue 37: a preload into a free slot must not hold back the steps that read other slots; the first step
    that reads it (or a clear of it) waits for it."""
    _, model, writer, _, packed = _setup(tmp_path, torch.float32)
    writer.install(0, packed["dora_all"])  # warm: compile, plans, pools
    writer.install(1, packed["dora_some"])
    writer.wait_all()
    torch.cuda.synchronize()
    compute = torch.cuda.current_stream()
    with torch.cuda.stream(writer.stream):
        torch.cuda._sleep(SLEEP)  # a long copy on the load stream
    writer.install(2, packed["dora_some"])  # queued behind it
    writer.wait_for([0, 1, -1])  # a step on slots 0, 1 and the base
    torch.cuda._sleep(1000)
    compute.synchronize()  # returns while the load is still running
    assert not writer.stream.query()
    stalled = writer.stalled_steps
    writer.wait_for([2, 0], timed=True)  # a step that reads slot 2
    marker = torch.cuda.Event()
    marker.record(compute)
    assert not marker.query()  # held behind the load
    torch.cuda.synchronize()
    assert writer.stalled_steps == stalled + 1 and writer.stall_seconds() > 0  # timed: that wait is counted
    torch.testing.assert_close(_rows(model, 2), _rows(model, 1), atol=0, rtol=0)
    # a clear of a slot whose load is pending lands after the load, not under it
    with torch.cuda.stream(writer.stream):
        torch.cuda._sleep(SLEEP)
    writer.install(2, packed["dora_all"])
    writer.clear(2)
    torch.cuda.synchronize()
    assert all(int(m.lora.rank[2].sum()) == 0 for m in model.lora_modules().values())
