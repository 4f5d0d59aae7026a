"""Paged KV cache bookkeeping: which fixed-size blocks of the cache each sequence owns.

The cache holds `num_blocks` blocks of `block_size` tokens. A sequence's `block_table[i]` is the block holding
its positions [i * block_size, (i + 1) * block_size). Blocks are handed out as a sequence grows, so no sequence
reserves max_model_len up front. The runner turns positions into cache slots with
`block_table[pos // block_size] * block_size + pos % block_size`.
"""

from __future__ import annotations

from collections import deque

from multilora_cli.engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Free list of KV blocks; grows and frees `Sequence.block_table`."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO reuse keeps recently freed blocks cold a little longer (nothing depends on it).
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens of one sequence."""
        return cdiv(num_tokens, self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its table covers `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        """Whether `seq` can grow to `num_tokens` tokens and still leave `reserve` blocks free."""
        return self.blocks_needed(seq, num_tokens) + reserve <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq.block_table` to cover `num_tokens` tokens. The caller checked `can_allocate`."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self._free):
            raise RuntimeError(f"KV cache: {need} blocks needed, {len(self._free)} free (scheduler bug)")
        for _ in range(need):
            seq.block_table.append(self._free.popleft())

    def try_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """`allocate` if the blocks are there; False (and no change) otherwise. The per-step hot path."""
        table = seq.block_table
        need = -(-num_tokens // self.block_size) - len(table)
        if need <= 0:
            return True
        free = self._free
        if need > len(free):
            return False
        for _ in range(need):
            table.append(free.popleft())
        return True

    def free(self, seq: Sequence) -> None:
        """Return all of `seq`'s blocks to the pool and empty its table."""
        self._free.extend(seq.block_table)
        seq.block_table = []
