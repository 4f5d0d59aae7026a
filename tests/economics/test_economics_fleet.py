"""Fleet arithmetic against hand computation: memory packing, the decode roofline, GPUs and dollars saved."""

from __future__ import annotations

import math

import pytest

from multilora_cli.economics import Scenario, compute

GB = 1e9


def test_default_llama2_fleet_by_hand():
    s = Scenario(tenants=100, model="llama-2-7b", max_loras=8)  # h100-sxm 80 GB 3.35 TB/s $2.99, KV 0.3, eff 0.8
    rep = compute(s)
    copy = 6_738_415_616 * 2
    adapter = 32 * 2**20
    # memory
    budget = 80 * GB * 0.7
    assert rep.section("memory")["adapters_fit"] == math.floor((budget - copy) / adapter)
    kvpt = 2 * 32 * 32 * 128 * 2  # K and V, 32 layers, 32 kv heads, head_dim 128, bf16
    assert rep.section("memory")["kv_bytes_per_token"] == kvpt == 512 * 1024
    fit = math.floor(80 * GB * 0.3 / (1024 * kvpt))
    # shared roofline: base minus input embedding, 8 distinct adapters (8 slots < 44 tenants drawn), KV
    batch = min(64, fit)
    weights = copy - 32000 * 4096 * 2
    step = (weights + 8 * adapter + batch * 1024 * kvpt) / (3.35e12 * 0.8)
    th = rep.section("throughput")
    assert th["batch"] == batch == 44
    assert th["adapters_per_step"] == 8
    assert th["step_seconds"] == pytest.approx(step)
    assert th["tokens_per_s"] == pytest.approx(batch / step)
    fl = rep.section("fleet")
    shared = math.ceil(100 * 50 / (batch / step))
    # dedicated: floor(56 GB / 13.48 GB) = 4 copies per GPU; each still meets 50 tok/s
    copies = math.floor(budget / copy)
    assert fl["dedicated_copies_per_gpu_by_memory"] == copies == 4
    b4 = min(64, math.floor(80 * GB * 0.3 / copies / (1024 * kvpt)))
    assert th["dedicated_tokens_per_s_per_copy"] == pytest.approx(
        b4 / (copies * (weights + b4 * 1024 * kvpt) / (3.35e12 * 0.8))
    )
    dedicated = math.ceil(100 / copies)
    assert (fl["dedicated_gpus"], fl["shared_gpus"], fl["dedicated_gpus_unpacked"]) == (dedicated, shared, 100)
    assert fl["gpus_saved"] == dedicated - shared
    assert fl["usd_per_month_saved"] == pytest.approx((dedicated - shared) * 2.99 * 730)
    assert fl["usd_per_month_dedicated"] == pytest.approx(dedicated * 2.99 * 730)


def test_default_slots_are_what_run_allocates():
    # multilora run without --max-loras (engine/slot_budget.py): one slot per adapter while they fit half of what
    # is left of (0.9 x memory - weights) after a KV reserve for the batch at its context, and at least 10% of it;
    # run's slots hold all 7 projections at the adapter's rank whatever it targets. The scenario's batch (64) and
    # context (1024) are the workload.
    slot = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024)) * 2  # the default q,k,v,o rank-16 shape, llama-3-8b
    run_slot = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)) * 2  # all 7: 84 MB
    spare = int(80 * GB * 0.9) - 8_029_995_008 * 2  # the matrices of llama-3-8b (norms left out)
    kv = 64 * 1024 * 2 * 32 * 8 * 128 * 2  # 64 sequences x 1024 tokens x K+V of 32 layers, 8 kv heads, bf16
    fit = math.floor(0.5 * (spare - kv) / run_slot)
    assert fit == 282
    rep = compute(Scenario(tenants=1000, model="llama-3-8b"))
    assert rep.section("memory")["slot_bytes"] == fit * slot
    assert compute(Scenario(tenants=100, model="llama-3-8b")).section("memory")["slot_bytes"] == 100 * slot
    # a KV reserve that leaves nothing: the floor, 10% of the memory beside the weights
    long = compute(Scenario(tenants=1000, model="llama-3-8b", batch_size=256, context_len=4096))
    assert long.section("memory")["slot_bytes"] == math.floor(0.1 * spare / run_slot) * slot
    big = 32 * 256 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)) * 2  # rank 256, all 7
    wide = compute(Scenario(tenants=100, model="llama-3-8b", rank=256, targets="all"))
    assert wide.section("memory")["slot_bytes"] == math.floor(0.5 * (spare - kv) / big) * big
    assert compute(Scenario(tenants=100, model="llama-3-8b", max_loras=8)).section("memory")["slot_bytes"] == 8 * slot


def test_overrides_drive_the_numbers():
    base = compute(Scenario(tenants=40, model="llama-3-8b"))
    cheap = compute(Scenario(tenants=40, model="llama-3-8b", gpu_hour_usd=1.0))
    assert cheap.section("fleet")["gpus_saved"] == base.section("fleet")["gpus_saved"]
    assert cheap.section("fleet")["usd_per_month_saved"] == pytest.approx(base.section("fleet")["gpus_saved"] * 730)
    fast = compute(Scenario(tenants=40, model="llama-3-8b", gpu_bandwidth_tbs=3.35 * 2))
    assert fast.section("throughput")["tokens_per_s_roofline"] == pytest.approx(
        2 * base.section("throughput")["tokens_per_s_roofline"]
    )
    small = compute(Scenario(tenants=40, model="llama-3-8b", gpu="a10g"))
    # a 16.06 GB copy fits the 24 GB x 0.7 = 16.8 GB weight budget: one GPU, and room for few adapters
    assert small.section("memory")["gpus_per_replica"] == 1
    adapter = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024)) * 2  # rank 16 q,o + k,v (8 kv heads), bf16
    assert small.section("memory")["adapters_fit"] == (24 * GB * 0.7 - 8_030_261_248 * 2) // adapter


def test_model_larger_than_one_gpu_uses_tensor_parallel_replicas():
    rep = compute(Scenario(tenants=10, model="llama-3-70b"))
    g = math.ceil(70_553_706_496 * 2 / (80 * GB * 0.7))
    assert rep.section("memory")["gpus_per_replica"] == g == 3
    assert rep.section("fleet")["dedicated_gpus"] == 10 * g
    assert rep.section("fleet")["shared_gpus"] % g == 0
    assert any("tensor parallel" in w for w in rep.warnings)


def test_throughput_bound_unpacks_dedicated_copies_and_multiplies_shared():
    low = compute(Scenario(tenants=100, model="llama-2-7b", tokens_per_tenant_per_s=1)).section("fleet")
    assert low["shared_gpus"] == 1 and low["shared_bound"] == "both"
    assert low["dedicated_copies_per_gpu"] == low["dedicated_copies_per_gpu_by_memory"] == 4

    mid = compute(Scenario(tenants=100, model="llama-2-7b", tokens_per_tenant_per_s=2000))
    fl, th = mid.section("fleet"), mid.section("throughput")
    m = fl["dedicated_copies_per_gpu"]
    assert m < 4 and th["dedicated_tokens_per_s_per_copy"] >= 2000  # fewer copies share a GPU's bandwidth
    assert fl["dedicated_gpus"] == math.ceil(100 / m)
    assert fl["shared_bound"] == "throughput"
    assert fl["shared_gpus"] == math.ceil(100 * 2000 / th["tokens_per_s"])

    high = compute(Scenario(tenants=100, model="llama-2-7b", tokens_per_tenant_per_s=5000))
    fl, th = high.section("fleet"), high.section("throughput")
    one_copy = th["dedicated_tokens_per_s_per_copy"]  # a whole GPU per copy is not enough
    assert fl["dedicated_copies_per_gpu"] == 1 and one_copy < 5000
    assert fl["dedicated_copies_per_tenant"] == math.ceil(5000 / one_copy)
    assert fl["dedicated_gpus"] == 100 * math.ceil(5000 / one_copy)


def test_memory_bound_when_adapters_outnumber_the_room():
    rep = compute(Scenario(tenants=100_000, model="llama-2-7b", rank=64, targets="all", tokens_per_tenant_per_s=0.01))
    fit = rep.section("memory")["adapters_fit"]
    assert rep.section("fleet")["shared_bound"] == "memory"
    assert rep.section("fleet")["shared_gpus"] == math.ceil(100_000 / fit)


def test_more_distinct_adapters_per_step_cost_bandwidth():
    one = compute(Scenario(tenants=100, model="llama-3-8b", max_loras=1)).section("throughput")
    many = compute(Scenario(tenants=100, model="llama-3-8b", max_loras=64)).section("throughput")
    assert one["adapters_per_step"] == 1 and 30 < many["adapters_per_step"] <= 64
    adapter = 32 * 16 * (2 * 8192 + 2 * 5120) * 2  # llama-3-8b rank 16 q,k,v,o in bf16: 27,262,976 B
    assert many["adapter_read_bytes"] == pytest.approx(many["adapters_per_step"] * adapter)
    assert many["step_seconds"] - one["step_seconds"] == pytest.approx(
        (many["adapters_per_step"] - 1) * adapter / (3.35e12 * 0.8)
    )
