"""The LoRA shrink on a side stream, beside the base matmul that reads the same x; the expand after both.

    s = fork_shrink(x, w, meta, side)      # side stream: s = scale * x @ A^T (waits for x on the main stream)
    y = F.linear(x, W)                     # main stream, concurrently
    join_expand(y, s, w, meta, side)       # main waits for the side stream, then y += s @ B^T

The shrink needs only x, so it does not have to queue behind the base matmul: in a decode step both read x and
neither reads the other's output. Run beside it, the shrink's latency-bound launch hides under the matmul
instead of adding to the chain of dependent launches. The kernels and their arithmetic are the ones
`add_lora` runs (the same bits); only the order of independent work changes. Capturable in CUDA graphs (torch
records the fork and the join as graph edges).

Ownership: x and s are allocated on the main stream and used on the side one; the join orders every later use
(and free) on the main stream after the side stream's work, so the caching allocator cannot hand them out early.
The expand is launched with `after_shrink=False`: with PDL its predecessor on the main stream is the matmul that
writes y, so it must not load y before its wait.
"""

from __future__ import annotations

import torch

from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.sgmv_expand import default_expand_blocks, lora_expand
from multilora_cli.kernels.sgmv_shrink import default_shrink_blocks, lora_shrink
from multilora_cli.kernels.sgmv_silu import lora_expand_silu_mul
from multilora_cli.kernels.weights import LoraWeights

__all__ = ["fork_shrink", "join_expand", "join_expand_silu_mul"]


def fork_shrink(x: torch.Tensor, w: LoraWeights, meta: LoraMeta, side: torch.cuda.Stream) -> torch.Tensor:
    """Launch the shrink of x on `side` after the main stream's work so far; returns s [split, T, n_slices, R]
    fp32 (valid on the main stream only after `join_expand*`)."""
    sb = default_shrink_blocks(x, w)
    s = torch.empty((sb.split, x.shape[0], w.n_slices, w.max_rank), dtype=torch.float32, device=x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        lora_shrink(x, w, meta, s, sb)
    return s


def join_expand(y: torch.Tensor, s: torch.Tensor, w: LoraWeights, meta: LoraMeta, side: torch.cuda.Stream) -> None:
    """y += each adapted token's delta from s (see `lora_expand`), after the side stream's shrink."""
    torch.cuda.current_stream(y.device).wait_stream(side)
    lora_expand(s, w, meta, y, default_expand_blocks(y, w), after_shrink=False)


def join_expand_silu_mul(y: torch.Tensor, s: torch.Tensor, w: LoraWeights, meta: LoraMeta,
                         side: torch.cuda.Stream) -> torch.Tensor:
    """silu(gate) * up of y = [gate | up] with each token's delta from s (see `lora_expand_silu_mul`): [T, I]."""
    torch.cuda.current_stream(y.device).wait_stream(side)
    out = torch.empty((y.shape[0], w.out_features // 2), dtype=y.dtype, device=y.device)
    lora_expand_silu_mul(s, w, meta, y, out, after_shrink=False)
    return out
