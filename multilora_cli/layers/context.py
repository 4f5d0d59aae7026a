"""Per-step attention/LoRA context: built once by the runner, read by every layer of the model.

Like nano-vllm, the context is module-level state (`set_context` / `get_context` / `reset_context`), so the
model's `forward(input_ids, positions)` stays a plain signature that CUDA graphs can capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from multilora_cli.kernels.meta import LoraMeta


@dataclass(slots=True)
class StepContext:
    """Everything one forward step needs besides the tokens and their positions.

    T = tokens in the step, B = sequences in the step. Token order: sequence by sequence, each
    sequence's tokens contiguous (the new tokens of sequence b are rows cu_seqlens_q[b]:cu_seqlens_q[b+1]).

    Both phases
      is_prefill:   True = new tokens of B sequences (any length, possibly after a cached prefix);
                    False = decode, exactly one new token per sequence (T == B).
      slot_mapping: [T] int64, flat KV-cache slot of each token's k/v = block_id * block_size + offset;
                    -1 = do not write (padding rows).
      seqlens_q:    host list[int] of B, new tokens per sequence (decode: all 1).
      seqlens_k:    host list[int] of B, tokens in the sequence's context incl. the new ones
                    (= cached prefix + new). The CPU path uses these instead of syncing on device tensors.
      lora:         kernels.LoraMeta of the step (one row per token), or None when no token is adapted.
      rope_long:    [T] bool or None. LongRoPE models only: which tokens take the long factors. None = the
                    position rule (position >= original_max_position_embeddings), which is exact for every
                    token but prompt tokens of a prompt longer than that (engine/runner.py sets it then).

    Prefill
      cu_seqlens_q: [B+1] int32 cumulative seqlens_q;  cu_seqlens_k: [B+1] int32 cumulative seqlens_k.
      max_seqlen_q / max_seqlen_k: ints.
      block_tables: [B, max_blocks] int32 or None. Needed when a sequence has a cached prefix
                    (seqlens_k[b] > seqlens_q[b], e.g. chunked prefill): its keys/values are then read back
                    from the paged cache. None = every sequence starts at position 0 (k == q).

    Decode
      context_lens: [B] int32 (== seqlens_k as a device tensor), block_tables: [B, max_blocks] int32.
      max_seqlen_k: int, longest context (sizes the split of the Triton kernel; 0 = derive).
    """

    is_prefill: bool
    slot_mapping: torch.Tensor
    seqlens_q: list[int] = field(default_factory=list)
    seqlens_k: list[int] = field(default_factory=list)
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    context_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    lora: LoraMeta | None = None
    rope_long: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.seqlens_q) != len(self.seqlens_k):
            raise ValueError("StepContext: seqlens_q and seqlens_k must have one entry per sequence")
        if any(q > k for q, k in zip(self.seqlens_q, self.seqlens_k)):
            raise ValueError("StepContext: a sequence has more new tokens than context tokens")
        if not self.is_prefill and self.context_lens is None:
            raise ValueError("StepContext: decode needs context_lens and block_tables")
        if not self.is_prefill and self.block_tables is None:
            raise ValueError("StepContext: decode needs block_tables")

    @property
    def num_seqs(self) -> int:
        return len(self.seqlens_q)

    @property
    def has_prefix(self) -> bool:
        """True when some sequence attends to cached tokens that are not in this step."""
        return any(k > q for q, k in zip(self.seqlens_q, self.seqlens_k))


_CONTEXT: StepContext | None = None


def set_context(ctx: StepContext | None) -> None:
    """Install the context the next forward reads."""
    global _CONTEXT
    _CONTEXT = ctx


def get_context() -> StepContext | None:
    """The current step's context (None outside a step)."""
    return _CONTEXT


def reset_context() -> None:
    """Forget the current step's context."""
    global _CONTEXT
    _CONTEXT = None


# Builders ---------------------------------------------------------------------------------------------
def _slots_for(blocks: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Flat cache slots of token positions [start, end) of a sequence owning `blocks` (in order)."""
    return [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]


def _padded_tables(block_tables: list[list[int]], device) -> torch.Tensor:
    width = max((len(b) for b in block_tables), default=0) or 1
    rows = [list(b) + [0] * (width - len(b)) for b in block_tables]  # pad entries are never read
    return torch.tensor(rows, dtype=torch.int32).to(device, non_blocking=True)


def _cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def prefill_context(
    seqlens_q: list[int],
    seqlens_k: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    lora: LoraMeta | None = None,
) -> StepContext:
    """Build a prefill context from host data.

    Sequence b owns `block_tables[b]` (enough blocks for seqlens_k[b] tokens); its new tokens sit at
    positions seqlens_k[b] - seqlens_q[b] ... seqlens_k[b] - 1 and are written to those slots.
    """
    for b, k in enumerate(seqlens_k):
        if len(block_tables[b]) * block_size < k:
            raise ValueError(f"sequence {b}: {len(block_tables[b])} blocks cannot hold {k} tokens")
    slots: list[int] = []
    for q, k, blocks in zip(seqlens_q, seqlens_k, block_tables):
        slots += _slots_for(blocks, k - q, k, block_size)
    mk = lambda v, dt: torch.tensor(v, dtype=dt).to(device, non_blocking=True)  # noqa: E731
    prefix = any(k > q for q, k in zip(seqlens_q, seqlens_k))
    return StepContext(
        is_prefill=True,
        slot_mapping=mk(slots, torch.int64),
        seqlens_q=list(seqlens_q),
        seqlens_k=list(seqlens_k),
        cu_seqlens_q=mk(_cumsum(seqlens_q), torch.int32),
        cu_seqlens_k=mk(_cumsum(seqlens_k), torch.int32),
        max_seqlen_q=max(seqlens_q, default=0),
        max_seqlen_k=max(seqlens_k, default=0),
        block_tables=_padded_tables(block_tables, device) if prefix else None,
        lora=lora,
    )


def decode_context(
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    lora: LoraMeta | None = None,
) -> StepContext:
    """Build a decode context: one new token per sequence, at position context_lens[b] - 1."""
    slots = [_slots_for(blocks, n - 1, n, block_size)[0] for n, blocks in zip(context_lens, block_tables)]
    mk = lambda v, dt: torch.tensor(v, dtype=dt).to(device, non_blocking=True)  # noqa: E731
    return StepContext(
        is_prefill=False,
        slot_mapping=mk(slots, torch.int64),
        seqlens_q=[1] * len(context_lens),
        seqlens_k=list(context_lens),
        max_seqlen_q=1,
        max_seqlen_k=max(context_lens, default=0),
        context_lens=mk(context_lens, torch.int32),
        block_tables=_padded_tables(block_tables, device),
        lora=lora,
    )
