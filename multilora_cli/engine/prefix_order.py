"""`PrefixQueue`: one adapter's waiting sequences, ordered so that requests sharing a prefix run together.

The offline schedule knows every queued request, so it can order them for the prefix cache
(engine/prefix_cache.py): admission already runs an adapter's requests together (engine/admission.py); within one
adapter's queue this order puts the sequences that share their first KV block next to each other, and within such
a group sorts them by their prompt tokens (trie order: the ones sharing the longest prefixes are neighbours):

    queue = preempted sequences (most recent first, as before)
          + groups by first block's tokens, in the order each group's first member arrived,
            each sorted by (prompt token ids, seq_id)

so a group's requests are admitted one after another while its prefix is cached, and a group that arrives later
never overtakes one that arrived earlier. Output order is untouched: the writer orders records by input line.
With the cache off the queue is plain arrival order (`WaitingQueues` then uses a deque).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from multilora_cli.engine.sequence import Sequence


def _order(seq: Sequence) -> tuple:
    return (seq.prompt_token_ids, seq.seq_id)


class PrefixQueue:
    """A deque-like queue (append, appendleft, popleft, [0], len, iter) in prefix order (see the module)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._front: deque[Sequence] = deque()  # re-queued at the front (preempted): they go first
        self._groups: dict[tuple, list[Sequence]] = {}  # first block's tokens -> members, sorted by `_order`
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Sequence]:
        yield from self._front
        for members in self._groups.values():
            yield from members

    def __getitem__(self, i: int) -> Sequence:
        if i != 0:
            raise IndexError("PrefixQueue gives its head only")
        if self._front:
            return self._front[0]
        return next(iter(self._groups.values()))[0]

    def append(self, seq: Sequence) -> None:
        members = self._groups.setdefault(tuple(seq.prompt_token_ids[: self.block_size]), [])
        bisect.insort(members, seq, key=_order)
        self._n += 1

    def appendleft(self, seq: Sequence) -> None:
        self._front.appendleft(seq)
        self._n += 1

    def popleft(self) -> Sequence:
        self._n -= 1
        if self._front:
            return self._front.popleft()
        key, members = next(iter(self._groups.items()))
        seq = members.pop(0)
        if not members:
            del self._groups[key]
        return seq
