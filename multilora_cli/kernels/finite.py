"""`flag_nonfinite`: whether a device buffer holds a NaN or an Inf, in one pass at the memory's speed, no host sync.

Why on the device: a CUDA slot load already copies an adapter's packed buffer to the device (engine/slot_writer.py);
checking it there replaces the host's pass over the same bytes (a 1.7 GB MoE adapter: one `aminmax` on the host's
OpenMP team, ~26 ms of every core, beside the reads and the step loop; benchmarks/HISTORY.md, sessions 27-28).
Here it is ~0.4 ms of the device's bandwidth on the load stream. A float is non-finite exactly when its exponent
bits are all ones, so the test reads the raw bits and needs no float compare (NaN compares false).

    flag_nonfinite(x, flag):
        x:    [N] float16 | bfloat16 | float32, contiguous (any N, the tail masked)
        flag: [1] int32 on x's device; set to 1 when some x[i] is NaN or +-Inf, left as it was otherwise
              (the caller zeroes it first); = reference(x) for a zeroed flag

Programs of BLOCK elements each raise the flag with an atomic max when their block holds one; no program
waits for another.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

BLOCK = 16384  # elements a program reads: 32 KB of bf16, ~52k programs for a 1.7 GB adapter
# (bits of the exponent field, the integer view of the dtype) per float dtype
_EXPONENT = {
    torch.float16: (0x7C00, torch.int16),
    torch.bfloat16: (0x7F80, torch.int16),
    torch.float32: (0x7F800000, torch.int32),
}


@triton.jit
def _nonfinite_kernel(x_ptr, flag_ptr, n, EXP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = tl.load(x_ptr + offs, mask=offs < n, other=0)
    bad = tl.max(((bits & EXP) == EXP).to(tl.int32), 0)
    if bad != 0:
        tl.atomic_max(flag_ptr, 1)


def flag_nonfinite(x: torch.Tensor, flag: torch.Tensor) -> None:
    """See the module docstring."""
    if x.dtype not in _EXPONENT:
        raise ValueError(f"flag_nonfinite: {x.dtype} is not a float16 / bfloat16 / float32 buffer")
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"flag_nonfinite: x must be 1-D contiguous, got shape {tuple(x.shape)}")
    if flag.dtype != torch.int32 or flag.numel() != 1 or flag.device != x.device:
        raise ValueError("flag_nonfinite: flag must be one int32 on x's device")
    if x.numel() == 0:
        return
    exp, view = _EXPONENT[x.dtype]
    launch(_nonfinite_kernel, (triton.cdiv(x.numel(), BLOCK),), x.view(view), flag, x.numel(), EXP=exp, BLOCK=BLOCK)


def reference(x: torch.Tensor) -> int:
    """The flag `flag_nonfinite` leaves in a zeroed one: 1 when x holds a NaN or an Inf."""
    return int(not bool(torch.isfinite(x).all()))
