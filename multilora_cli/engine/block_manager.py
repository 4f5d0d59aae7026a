"""Paged KV cache bookkeeping: which fixed-size blocks of the cache each sequence holds, reference-counted.

The cache holds `num_blocks` blocks of `block_size` tokens. A sequence's `block_table[i]` is the block holding
its positions [i * block_size, (i + 1) * block_size). Blocks are handed out as a sequence grows, so no sequence
reserves max_model_len up front. The runner turns positions into cache slots with
`block_table[pos // block_size] * block_size + pos % block_size`.

Invariants:
- every block is either free (reference count 0, in the free list once) or in the block tables of as many
  sequences as its reference count; `num_free_blocks + distinct blocks in use == num_blocks`;
- a block is shared (count > 1) only through `share`: the samples of one request (n > 1) share the FULL blocks
  of their prompt, written once by sample 0 before the fork. A sequence writes KV only at positions >=
  its num_computed_tokens, which for a forked sample starts past the shared blocks, so no write ever lands in a
  shared block (the prompt's last, partial block is each sample's own: no copy-on-write is needed);
- `free` drops one reference per block of the table; a block returns to the pool when its last holder frees it
  (finished, failed or preempted: a preempted sample recomputes prompt + its own tokens into blocks of its own).
"""

from __future__ import annotations

from collections import deque

from multilora_cli.engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Free list and reference counts of KV blocks; grows, shares and frees `Sequence.block_table`."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO reuse keeps recently freed blocks cold a little longer (nothing depends on it).
        self._free: deque[int] = deque(range(num_blocks))
        self._refs: list[int] = [0] * num_blocks  # sequences holding each block
        self.num_allocated = 0  # blocks handed out from the free list so far (sharing hands out none)
        self.num_shared = 0  # block references handed out by `share` so far

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def refcount(self, block: int) -> int:
        """Sequences whose table holds `block` (0 = free)."""
        return self._refs[block]

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
        self._take(seq.block_table, need)

    def try_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """`allocate` if the blocks are there; False (and no change) otherwise. The per-step hot path."""
        table = seq.block_table
        need = -(-num_tokens // self.block_size) - len(table)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        self._take(table, need)
        return True

    def _take(self, table: list[int], need: int) -> None:
        free, refs = self._free, self._refs
        for _ in range(need):
            b = free.popleft()
            refs[b] = 1
            table.append(b)
        self.num_allocated += need

    def share(self, src: Sequence, dst: Sequence, num_blocks: int) -> None:
        """Give `dst` (no blocks yet) the first `num_blocks` blocks of `src`'s table: full, already written
        blocks that neither writes again (see the invariants above)."""
        if dst.block_table:
            raise RuntimeError("share(): the receiving sequence already holds blocks")
        blocks = src.block_table[:num_blocks]
        if len(blocks) != num_blocks:
            raise RuntimeError(f"share(): {num_blocks} blocks asked, the source holds {len(src.block_table)}")
        refs = self._refs
        for b in blocks:
            refs[b] += 1
        dst.block_table = blocks
        self.num_shared += num_blocks

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s reference to each of its blocks (a block nobody holds returns to the pool); empty its
        table."""
        refs, free = self._refs, self._free
        for b in seq.block_table:
            refs[b] -= 1
            if refs[b] == 0:
                free.append(b)
        seq.block_table = []
