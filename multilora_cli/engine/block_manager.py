"""Paged KV cache bookkeeping: which fixed-size blocks of the cache each sequence holds, reference-counted.

The cache holds `num_blocks` blocks of `block_size` tokens. A sequence's `block_table[i]` is the block holding
its positions [i * block_size, (i + 1) * block_size). Blocks are handed out as a sequence grows, so no sequence
reserves max_model_len up front. The runner turns positions into cache slots with
`block_table[pos // block_size] * block_size + pos % block_size`.

Invariants:
- every block is either free (reference count 0: in the free list once, or idle in the prefix cache) or in the
  block tables of as many sequences as its reference count; `num_free_blocks + distinct blocks in use ==
  num_blocks`;
- a block is shared (count > 1) in two ways, and nobody ever writes a block it shares: a sequence writes KV only
  at positions >= its num_computed_tokens, which starts past its shared blocks (no copy-on-write is needed):
  * `share`: the samples of one request (n > 1) share the FULL blocks of their prompt, written once by sample 0
    before the fork (the prompt's last, partial block is each sample's own);
  * a prefix-cache hit (engine/prefix_cache.py): a sequence that takes part (`Sequence.prefix_id` set)
    registers each full block once it is computed; a later sequence with the same tokens under the same adapter
    identity starts with those blocks in its table (`begin`) and computes only what follows. A hit covers whole
    blocks and never the last token (its logits are needed);
- `free` drops one reference per block of the table; a block returns to the pool when its last holder frees it
  (finished, failed or preempted: a preempted sequence recomputes, from its cached blocks if still there). A
  registered block whose last holder frees it stays in the cache, idle: it counts as free (`num_free_blocks`) and
  is handed out, least recently released first, only when no plain free block is left;
- sliding window (`window` W: every layer of the model slides, models/config.py `kv_window`): a query at
  position p reads keys at (p - W, p] only, so once a sequence's next query is at position >= p (`slide`), its
  blocks wholly at positions <= p - W are never read again and it drops them as `free` would, early: the
  table keeps its length (block i still covers positions [i * block_size, (i + 1) * block_size)) with
  `block_table[:num_dropped]` set to DROPPED (-1). Every attention path starts its key loop at the window's
  first block, so no DROPPED entry is ever read; a dropped block is whole and correct, so if registered it
  stays in the prefix cache (idle once nobody holds it), reachable by a later sequence with that prefix.
"""

from __future__ import annotations

from collections import deque

from multilora_cli.engine.prefix_cache import PrefixIndex
from multilora_cli.engine.sequence import Sequence

DROPPED = -1  # a block-table entry released behind the sliding window (never read)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Free list and reference counts of KV blocks; grows, shares and frees `Sequence.block_table`."""

    def __init__(self, num_blocks: int, block_size: int, window: int | None = None):
        if num_blocks < 1 or block_size < 1 or (window is not None and window < 1):
            raise ValueError(f"num_blocks, block_size, window must be >= 1, got {num_blocks}, {block_size}, {window}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window  # every layer's sliding window (None: full attention somewhere: keep every block)
        # FIFO reuse keeps recently freed blocks cold a little longer (nothing depends on it).
        self._free: deque[int] = deque(range(num_blocks))
        self._refs: list[int] = [0] * num_blocks  # sequences holding each block
        self.num_allocated = 0  # blocks handed out from the free list so far (sharing hands out none)
        self.num_shared = 0  # block references handed out by `share` so far
        self.cache = PrefixIndex()
        self.prompt_tokens = 0  # tokens of the sequences `begin` started from nothing (prefix-cache stats)
        self.hit_tokens = 0  # of those, tokens whose KV came from the cache

    @property
    def num_free_blocks(self) -> int:
        """Blocks `allocate` can hand out: plain free ones and idle cached ones (evicted on demand)."""
        return len(self._free) + self.cache.num_idle

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def refcount(self, block: int) -> int:
        """Sequences whose table holds `block` (0 = free)."""
        return self._refs[block]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens of one sequence."""
        return cdiv(num_tokens, self.block_size)

    def blocks_at_once(self, num_tokens: int, chunk: int) -> int:
        """Most blocks one sequence growing to `num_tokens` tokens, fed at most `chunk` a step, holds at once: with
        a window W a step at positions s .. s + chunk - 1 holds blocks (s - W + 1) // bs .. (s + chunk - 1) // bs
        (`slide` dropped those before), at most cdiv(W - 1 + chunk, bs) + 1 of them."""
        n = self.blocks_for(num_tokens)
        if self.window is None:
            return n
        return min(n, cdiv(self.window - 1 + chunk, self.block_size) + 1)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its table covers `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        """Whether `seq` can grow to `num_tokens` tokens and still leave `reserve` blocks free."""
        return self.blocks_needed(seq, num_tokens) + reserve <= self.num_free_blocks

    # --- prefix cache ------------------------------------------------------------------------------------------
    def lookup(self, seq: Sequence) -> list[int]:
        """Cached blocks `seq` (holding none yet) can start from: its longest registered prefix of full blocks
        under its adapter identity, short of its last token. [] when it takes no part or may take no hits."""
        if seq.prefix_id is None or not seq.may_take_hits or seq.block_table:
            return []
        limit = (len(seq.token_ids) - 1) // self.block_size
        if limit <= 0:
            return []
        return self.cache.match(seq.prefix_id, seq.token_ids, limit, self.block_size)

    def can_begin(self, seq: Sequence, hits: list[int], num_tokens: int, reserve: int = 0) -> bool:
        """Whether `seq` can start from `hits` (from `lookup`) and grow to `num_tokens` tokens, leaving `reserve`
        blocks free: an idle hit leaves the free pool as a new block would."""
        idle = sum(1 for b in hits if self._refs[b] == 0)
        return self.blocks_for(num_tokens) - len(hits) + idle + reserve <= self.num_free_blocks

    def begin(self, seq: Sequence, hits: list[int]) -> None:
        """`seq` (no blocks, nothing computed) starts: hold `hits`, its first len(hits) blocks' KV is computed.
        Counts its tokens and hits for the stats."""
        refs, cache = self._refs, self.cache
        for b in hits:
            if refs[b] == 0:
                cache.unpark(b)
            refs[b] += 1
        seq.block_table = list(hits)
        seq.cache_nodes = [cache.node(b) for b in hits]
        seq.num_computed_tokens = len(hits) * self.block_size
        self.prompt_tokens += len(seq.token_ids)
        self.hit_tokens += seq.num_computed_tokens

    def register(self, seq: Sequence) -> None:
        """Register `seq`'s full blocks computed since the last call (the caller checked it takes part and that
        `num_computed_tokens // block_size > len(seq.cache_nodes)`)."""
        nodes, bs, cache = seq.cache_nodes, self.block_size, self.cache
        for i in range(len(nodes), seq.num_computed_tokens // bs):
            parent = nodes[-1] if nodes else 0
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            nodes.append(cache.register(parent, tokens, seq.prefix_id, seq.block_table[i]))

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq.block_table` to cover `num_tokens` tokens. The caller checked `can_allocate`."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"KV cache: {need} blocks needed, {self.num_free_blocks} free (scheduler bug)")
        self._take(seq.block_table, need)

    def try_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """`allocate` if the blocks are there; False (and no change) otherwise. The per-step hot path."""
        table = seq.block_table
        need = -(-num_tokens // self.block_size) - len(table)
        if need <= 0:
            return True
        if need > len(self._free) + self.cache.num_idle:
            return False
        self._take(table, need)
        return True

    def _take(self, table: list[int], need: int) -> None:
        free, refs = self._free, self._refs
        for _ in range(need):
            b = free.popleft() if free else self.cache.evict()  # a plain block first, else the LRU idle one
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
            if b >= 0:  # (DROPPED entries: src dropped them before dst's window, see Scheduler._slide)
                refs[b] += 1
        dst.block_table = blocks
        dst.num_dropped = min(src.num_dropped, num_blocks)
        dst.cache_nodes = src.cache_nodes[:num_blocks]  # (fewer if src registered fewer: dst registers the rest)
        self.num_shared += num_blocks

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s reference to each of its blocks, last to first (a block nobody holds returns to the pool,
        idle in the cache if registered, so the prefix's tail is evicted before its head); empty its table."""
        refs, free, park = self._refs, self._free, self.cache.park
        for b in reversed(seq.block_table[seq.num_dropped :]):
            refs[b] -= 1
            if refs[b] == 0 and not park(b):
                free.append(b)
        seq.block_table = []
        seq.cache_nodes = []
        seq.num_dropped = 0

    def slide(self, seq: Sequence, first_query: int) -> None:
        """Sliding window: `seq` asks no query at a position below `first_query` any more (the caller knows: its
        computed tokens, its pending forks), so its blocks wholly at positions <= first_query - window, i.e. table
        entries below (first_query - window + 1) // block_size, are never read again: drop them (DROPPED), first
        to last, each returning to the pool (idle in the cache if registered) when its last holder drops it.
        No-op without a window."""
        if self.window is None:
            return
        upto = min((first_query - self.window + 1) // self.block_size, len(seq.block_table))
        if upto <= seq.num_dropped:
            return
        table, refs, free, park = seq.block_table, self._refs, self._free, self.cache.park
        for i in range(seq.num_dropped, upto):
            b = table[i]
            table[i] = DROPPED
            refs[b] -= 1
            if refs[b] == 0 and not park(b):
                free.append(b)
        seq.num_dropped = upto
