"""`PrefixIndex`: which full KV blocks hold which prefix, under which adapter; the LRU of those nobody holds.

A full block is registered under the key (parent node, its block_size token ids, adapter identity), where the
parent node names the registered block holding the block_size tokens before it (0 for a sequence's first
block). Chained, a key therefore stands for the whole prefix up to the block's end, under one adapter:

    block i of tokens t[0 : (i+1)B] under adapter a  ->  key_i = (node(key_{i-1}), tuple(t[iB : (i+1)B]), a)

Node ids are handed out once and never reused, and keys are compared whole (dict equality), so a hit is exact:
no hash collision can ever return another prefix's KV, and a block evicted and reused for other tokens can never
be reached through a child registered under its old node (those children are unreachable: they leave the index
when the LRU evicts them, oldest first). Adapter identity is the adapter's content hash (adapters/identity.py),
"base" for base rows: any LoRA on any layer changes every later layer's K/V, so nothing is shared across adapters.

Registered blocks that no sequence holds are idle: still free memory (BlockManager hands them out when no plain
free block is left, least recently released first), but a later sequence with the same prefix takes them back
as a hit. A sequence releases its blocks last to first, so a prefix's tail is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict

DEAD = -1  # the node of a block registered under an evicted parent: its children are not registered


class PrefixIndex:
    """key -> block for registered full blocks, block -> (key, node), and the idle (unheld) ones in LRU order."""

    def __init__(self):
        self._block_of: dict[tuple, int] = {}  # key -> registered block
        self._entry: dict[int, tuple[tuple, int]] = {}  # registered block -> (its key, its node)
        self._live: set[int] = set()  # nodes of registered blocks
        self._idle: OrderedDict[int, None] = OrderedDict()  # registered, held by nobody; least recent first
        self._next_node = 1
        self.num_evicted = 0  # idle blocks handed out again for other tokens

    def __len__(self) -> int:
        """Registered blocks (held or idle)."""
        return len(self._entry)

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def is_idle(self, block: int) -> bool:
        return block in self._idle

    def node(self, block: int) -> int:
        """The node of registered `block` (DEAD if it is not registered)."""
        e = self._entry.get(block)
        return DEAD if e is None else e[1]

    def match(self, identity: str, token_ids: list[int], num_blocks: int, block_size: int) -> list[int]:
        """The registered blocks holding `token_ids`' first full blocks under `identity`, longest chain first
        found, at most `num_blocks` of them."""
        out: list[int] = []
        parent = 0
        get, entry = self._block_of.get, self._entry
        for i in range(num_blocks):
            b = get((parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), identity))
            if b is None:
                break
            out.append(b)
            parent = entry[b][1]
        return out

    def register(self, parent: int, tokens: tuple, identity: str, block: int) -> int:
        """Register `block` (full, computed, held) as holding `tokens` after node `parent`; the node that now
        stands for this prefix: `block`'s new node, or the node of a block that already held it (two sequences
        computed the same prefix side by side: `block` stays unregistered and is freed as a plain block)."""
        if parent == DEAD or (parent and parent not in self._live):
            return DEAD  # the prefix before it was evicted: nobody can reach this block through the index
        key = (parent, tokens, identity)
        have = self._block_of.get(key)
        if have is not None:
            return self._entry[have][1]
        if block in self._entry:  # (registered under another chain: keep the first, stop this one)
            return DEAD
        node = self._next_node
        self._next_node += 1
        self._block_of[key] = block
        self._entry[block] = (key, node)
        self._live.add(node)
        return node

    def alive(self, node: int) -> bool:
        return node in self._live

    def park(self, block: int) -> bool:
        """`block`'s last holder released it: keep it idle if registered (True); False: a plain free block."""
        if block not in self._entry:
            return False
        self._idle[block] = None
        return True

    def unpark(self, block: int) -> None:
        """An idle block is held again (a hit)."""
        del self._idle[block]

    def evict(self) -> int:
        """Unregister the least recently released idle block and return it, to be reused as a fresh block."""
        block, _ = self._idle.popitem(last=False)
        self.num_evicted += 1
        key, node = self._entry.pop(block)
        del self._block_of[key]
        self._live.discard(node)
        return block
