"""GPU counts: dedicated full fine-tune copies vs one shared base serving every tenant's LoRA.

Decode is memory-bandwidth bound, so a decode step of batch b takes (bytes read) / (effective bandwidth):
  weights read once per step (the input embedding is only gathered, so it is left out unless tied to lm_head)
  + each distinct adapter in the step, read once (rank-aware, read-once SGMV kernels)
  + the KV cache of every sequence: b * context * kv_bytes_per_token.
Tokens/s = b / step time. The batch is capped by how many sequences' KV fit in the KV reserve.
A model too big for one GPU's weight budget is split over g GPUs (tensor parallel, ideal scaling assumed):
a "replica" is g GPUs with g x memory and g x bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from multilora_cli.errors import UsageError


def ceil_div(a: float, b: float) -> int:
    """ceil(a / b), ignoring float noise just above an integer (8.000000001 -> 8)."""
    q = a / b
    r = round(q)
    # relative tolerance only: an absolute one rounded a tiny positive quotient (10 tenants / 5e12 replicas) to 0
    return int(r) if math.isclose(q, r, rel_tol=1e-9) else math.ceil(q)


@dataclass(slots=True, frozen=True)
class Hardware:
    """Per-GPU figures in bytes and bytes/s, plus the memory split the plan assumes."""

    memory: float  # bytes
    bandwidth: float  # effective bytes/s (peak x efficiency)
    kv_reserve: float  # fraction of memory kept for KV cache + activations

    def gpus_per_replica(self, copy_bytes: float) -> int:
        return max(1, ceil_div(copy_bytes, self.memory * (1 - self.kv_reserve)))


@dataclass(slots=True, frozen=True)
class Workload:
    """What every copy or replica runs: decode at up to `batch_cap` sequences of `context` tokens each."""

    copy_bytes: float  # full base weights (memory)
    weights_read: float  # bytes read per decode step for the base
    kv_per_token: float  # bytes of K and V per token, all layers
    context: int
    batch_cap: int

    def batch(self, kv_budget: float) -> int:
        return min(self.batch_cap, int(kv_budget // (self.context * self.kv_per_token)))

    def step_seconds(self, batch: int, adapter_bytes_read: float, bandwidth: float) -> float:
        return (self.weights_read + adapter_bytes_read + batch * self.context * self.kv_per_token) / bandwidth


@dataclass(slots=True)
class Dedicated:
    gpus_per_replica: int  # GPUs one full copy needs (1 unless it does not fit)
    copies_per_gpu_by_memory: int
    copies_per_gpu: int  # after the throughput check
    batch_per_copy: int
    tokens_per_s_per_copy: float
    copies_per_tenant: int  # > 1 when one copy cannot meet a tenant's demand
    gpus_by_memory: int
    gpus_unpacked: int  # one GPU (or replica) per copy, no packing
    gpus: int


def plan_dedicated(tenants: int, demand: float, work: Workload, hw: Hardware) -> Dedicated:
    """Each tenant gets its own full copy. Copies are packed per GPU by memory, then unpacked until every copy
    still meets `demand` tokens/s (packed copies share the GPU's bandwidth and KV reserve)."""
    g = hw.gpus_per_replica(work.copy_bytes)
    by_mem = int(hw.memory * (1 - hw.kv_reserve) // work.copy_bytes) if g == 1 else 1
    best = None
    for m in range(by_mem, 0, -1):
        b = work.batch(g * hw.memory * hw.kv_reserve / m)
        if b < 1:
            continue
        tps = b / (m * work.step_seconds(b, 0.0, g * hw.bandwidth))  # m copies take turns on the bandwidth
        best = (m, b, tps)
        if tps >= demand:
            break
    if best is None:
        raise UsageError(
            f"one sequence of {work.context} tokens does not fit the KV reserve of a dedicated copy",
            hint="raise --kv-reserve or lower --context-len",
        )
    m, b, tps = best
    per_tenant = 1 if tps >= demand else ceil_div(demand, tps)
    by_memory = ceil_div(tenants, by_mem) * g
    gpus = (ceil_div(tenants, m) if per_tenant == 1 else tenants * per_tenant) * g
    return Dedicated(g, by_mem, m, b, tps, per_tenant, by_memory, tenants * per_tenant * g, gpus)


@dataclass(slots=True)
class Shared:
    gpus_per_replica: int
    adapters_fit: int  # adapters resident beside the base, inside the weight budget
    batch: int
    distinct_per_step: float  # adapters read per decode step
    step_seconds: float  # roofline
    tokens_per_s_roofline: float
    tokens_per_s: float  # roofline or measured
    replicas_by_memory: int
    replicas_by_throughput: int
    gpus: int

    @property
    def bound(self) -> str:
        m, t = self.replicas_by_memory, self.replicas_by_throughput
        return "both" if m == t else "memory" if m > t else "throughput"


def plan_shared(
    tenants: int,
    demand: float,
    work: Workload,
    hw: Hardware,
    adapter_bytes: float,
    distinct_per_step,
    measured_tps: float | None = None,
) -> Shared:
    """One base per replica serves many tenants: bounded by adapters resident in memory and by tokens/s.

    `distinct_per_step(batch)` -> distinct adapters read in a decode step of that batch.
    """
    g = hw.gpus_per_replica(work.copy_bytes)
    fit = int((g * hw.memory * (1 - hw.kv_reserve) - work.copy_bytes) // adapter_bytes)
    if fit < 1:
        raise UsageError(
            "the base model leaves no room for even one adapter in the weight budget",
            hint="raise GPU memory or lower --kv-reserve",
        )
    b = work.batch(g * hw.memory * hw.kv_reserve)
    if b < 1:
        raise UsageError(
            f"one sequence of {work.context} tokens does not fit the KV reserve",
            hint="raise --kv-reserve or lower --context-len",
        )
    k = distinct_per_step(b)
    step = work.step_seconds(b, k * adapter_bytes, g * hw.bandwidth)
    roof = b / step
    tps = measured_tps if measured_tps is not None else roof
    by_mem = ceil_div(tenants, fit)
    by_tput = ceil_div(tenants * demand, tps)
    return Shared(g, fit, b, k, step, roof, tps, by_mem, by_tput, g * max(by_mem, by_tput))
