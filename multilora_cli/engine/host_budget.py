"""How many adapters the host cache keeps when `--max-cpu-loras` is not given, and a clear word when a given
count does not fit (issue 38: thousands of adapters).

The host cache holds packed adapters in the pinned arena (engine/pinned.py), which is capped at
PINNED_HOST_FRACTION of physical host memory and also holds the reads in flight. So:

    blocks  = PINNED_HOST_FRACTION x host memory // largest packed adapter (4 KiB aligned)
    fit     = blocks - min(in_flight, blocks // 2)       (pinned.host_cache_capacity keeps those for reads)
    in_flight = min(max_loras, max_num_seqs)              (SlotManager.read_ahead: reads a wave ahead)
    default = clamp(fit, 1, adapters)                     (every adapter when they all fit)

A 1B-shape rank-16 adapter is 22.5 MB: 1,000 of them (22.5 GB) fit a 128 GiB host's 32 GiB share. A Llama-3-8B
one is 84 MB: ~380 fit there, and the rest are read from disk (the OS page cache) when a slot needs them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from multilora_cli.engine.pinned import ALIGN, PINNED_HOST_FRACTION

FALLBACK_HOST_BYTES = 16 << 30  # when neither sysconf nor /proc/meminfo answers


def host_memory_bytes() -> int:
    """Physical host memory: sysconf, else /proc/meminfo's MemTotal, else FALLBACK_HOST_BYTES."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_HOST_BYTES


@dataclass(frozen=True, slots=True)
class HostCacheChoice:
    """The host cache's size, why, and a warning when what was asked (or all adapters) does not fit."""

    max_cpu_loras: int
    reason: str
    warning: str | None = None


def choose_max_cpu_loras(
    adapter_bytes: list[int], in_flight: int, given: int | None, host_bytes: int | None = None
) -> HostCacheChoice:
    """The rule in the module docstring; `given` (--max-cpu-loras) is kept, with a warning when it cannot fit
    (the engine then caches fewer: pinned.host_cache_capacity)."""
    host = host_memory_bytes() if host_bytes is None else host_bytes
    n = max(1, len(adapter_bytes))
    largest = -(-max(adapter_bytes, default=1) // ALIGN) * ALIGN
    budget = int(PINNED_HOST_FRACTION * host)
    blocks = budget // largest
    fit = max(1, blocks - min(in_flight, blocks // 2))
    where = f"{PINNED_HOST_FRACTION:.0%} of {host / 2**30:.0f} GiB host memory, adapters of {largest / 1e6:.1f} MB"
    if given is not None:
        warn = None
        if given > fit:
            warn = (
                f"--max-cpu-loras {given} does not fit the host cache: {where} hold {fit} beside the reads in "
                f"flight; it keeps {fit} and reads the others from disk when a slot needs them"
            )
        return HostCacheChoice(given, f"--max-cpu-loras {given}", warn)
    k = min(n, fit)
    warn = None
    if k < len(adapter_bytes):
        warn = (
            f"the host cache holds {k} of {len(adapter_bytes)} adapters ({where}); the others are read from disk "
            "when a slot needs them (a faster disk or more host memory helps)"
        )
    return HostCacheChoice(k, f"{k} = min({len(adapter_bytes)} adapters, {fit} that fit {where})", warn)
