"""Programmatic dependent launch (PDL) for the SGMV kernels (and the MoE row path's expert-LoRA chain,
kernels/fused_moe.row_pdl): hide each launch behind the previous kernel's tail.

At decode sizes a layer's eight LoRA launches are latency-bound: each CTA first walks tile -> slot -> rank ->
token rows, then fetches its weights, and only then does work, and the next launch starts only when the
previous grid has drained. With PDL (sm_90+) a kernel is launched while its predecessor still runs: its CTAs
read the step's metadata (written before the graph's first kernel) and, optionally, pull their adapter's A or
B lines into L2 (weights never change during a step); then `gdc_wait()` blocks until the predecessor grid has
finished and its writes are visible. Activations (x, s, y) are only touched after the wait: results are
bit-identical. A CTA lets its own successor launch only after its wait, so at most two grids of the chain
hold SM slots at once.

CTAs with no work (padding tiles of a graph's static grid, rank-0 slices) exit at once, except the grid's
first CTA, which always passes `gdc_wait()`: a grid then never completes before its predecessor, so ordering
stays transitive along the chain, while idle CTAs do not sit on SM slots waiting.

When (H200, one Llama-3-8B layer, rank 16): PDL with the L2
prefetch at <= 64 tokens (1 token 36.0 -> 22.7 us, 16 tokens / 8 adapters 47.5 -> 39.4), PDL alone up to 1024
tokens (256 tokens / 64 adapters 101.7 -> 95.3 us, 256 / 16 adapters 66.5 -> 61.5; the prefetch costs more
than it hides there), off above (4096 tokens: 386 -> 410 us with PDL). MULTILORA_PDL=0 turns it off.
Off on CPU, under TRITON_INTERPRET and below sm_90.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

try:  # triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older triton: the launchers never enable PDL
    gdc_launch_dependents = gdc_wait = None

LINE_BYTES = 128  # an L2 line: the prefetch granularity
PREFETCH_LINES = 2048  # most lines one CTA prefetches (their pointers sit in registers while issued)
PREFETCH_MAX_TOKENS = 64  # the table: prefetch up to here, PDL alone up to PDL_MAX_TOKENS, off above
PDL_MAX_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class PdlMode:
    """launch: launch with PDL and wait in-kernel; prefetch: pull the CTA's weight lines into L2 before waiting."""

    launch: bool = False
    prefetch: bool = False

    def __post_init__(self):
        if self.prefetch and not self.launch:
            raise ValueError("PdlMode: prefetch needs launch (it only pays while waiting on the predecessor)")

    def kwargs(self) -> dict:
        """Extra launch keywords (none when off, so older triton and the interpreter never see launch_pdl)."""
        return {"launch_pdl": True} if self.launch else {}


OFF = PdlMode()
_FORCED: PdlMode | None = None


def force(mode: PdlMode | None) -> None:
    """Override the table for every launch on a PDL-capable device (tests and benchmarks compare modes); None restores it."""
    global _FORCED
    _FORCED = mode


@lru_cache(maxsize=16)
def _supported(index: int) -> bool:
    # sm_90+ NVIDIA only: ROCm reports MI300 as capability 9.x, and the PTX below would not build there
    return gdc_wait is not None and torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on", "y")


def table_mode(tokens: int) -> PdlMode:
    """The measured choice for a launch over `tokens` rows (static per CUDA-graph batch size)."""
    if tokens > PDL_MAX_TOKENS:
        return OFF
    return PdlMode(launch=True, prefetch=tokens <= PREFETCH_MAX_TOKENS)


def pdl_mode(device: torch.device, tokens: int) -> PdlMode:
    """The mode the launchers use for `tokens` rows on `device`."""
    if device.type != "cuda" or _interpreting():
        return OFF
    if not _supported(device.index if device.index is not None else torch.cuda.current_device()):
        return OFF
    if _FORCED is not None:
        return _FORCED
    if os.environ.get("MULTILORA_PDL", "").strip() == "0":
        return OFF
    return table_mode(tokens)


@triton.jit
def prefetch_l2(base, offs, ok):
    """Hint the lines at base + offs (masked by ok) into L2: no registers held, no wait, no fault (masked
    addresses fall back to base, which the CTA reads anyway)."""
    ptrs = base + tl.where(ok, offs, 0)
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait_predecessor(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
