"""n completions of one prompt: the seats they hold and the fork that starts samples 1 .. n-1.

A request with n > 1 is admitted as one sequence (sample 0) that holds seats for its n - 1 forks as well, so
`max_num_seqs` (which sizes the decode batch, the CUDA graphs and the host buffers) bounds the sequences running
once they fork; it prefills the prompt once (chunked like any prompt) and, when it samples its first token, the
prompt is in the cache and the others fork (`_fork`), in the same `postprocess`:

    prompt L tokens, block size B, F = ((L - 1) // B) * B  (the full blocks before the prompt's last token)
    sample 0:   [ block 0 | block 1 | ... | block F/B - 1 | partial block: F .. L-1, then its own tokens ]
    sample i:   [ shared with sample 0 (ref-counted)       | own block: recomputes F .. L-1, samples ]

Each fork gets sample 0's adapter slot (one more pin on it) and runs at once; it computes L - F tokens (1 ..
B) of the prompt, with attention over the shared blocks, and then samples its own first token with its own seed.
Sharing only full blocks means nothing is copied and no shared block is ever written (engine/block_manager.py).
A request with more samples than `max_num_seqs` seats holds all the seats; the forks beyond them queue as
ordinary waiting sequences (they recompute the prompt when admitted). A fork preempted later frees its
references and recomputes prompt + its own tokens, like any preempted sequence. Mixed into `Scheduler`.
"""

from __future__ import annotations

from multilora_cli.engine.sequence import SeqStatus, Sequence


class Forking:
    """Seat accounting for pending forks (`num_seats`) and `_fork`. Uses the Scheduler's state."""

    _reserved: int  # seats held by running sequences for their pending forks
    private_prompts_upto: int | None  # prompts this short are not shared with forks (LongRoPE recomputes them)

    @property
    def num_seats(self) -> int:
        """Seats taken: running sequences plus the forks they will make (at most max_num_seqs)."""
        return len(self.running) + self._reserved

    def seats_for(self, seq: Sequence) -> int:
        """Seats `seq` takes when admitted: itself and its pending forks, at most all of them."""
        return min(1 + seq.pending_forks, self.max_num_seqs)

    def _hold_seats(self, seq: Sequence) -> None:
        """`seq` was admitted: hold seats for its forks."""
        seq.reserved_seats = self.seats_for(seq) - 1
        self._reserved += seq.reserved_seats

    def _drop_seats(self, seq: Sequence) -> None:
        """`seq` leaves the running list (finished, failed, preempted) or forked: its held seats are free."""
        self._reserved -= seq.reserved_seats
        seq.reserved_seats = 0

    def _fork(self, parent: Sequence) -> None:
        """Start samples 1 .. n-1 of `parent`'s request: `parent` has computed its whole prompt and just
        sampled its first token (its blocks cover the prompt)."""
        bs = self.bm.block_size
        shared = (parent.num_prompt_tokens - 1) // bs
        limit = self.private_prompts_upto
        if limit is not None and parent.num_prompt_tokens <= limit:
            shared = 0  # the parent recomputes these blocks in place later (LongRoPE): each fork keeps its own
        seats = parent.reserved_seats
        self._drop_seats(parent)
        for i in range(1, parent.pending_forks + 1):
            if i > seats:  # more samples than max_num_seqs: the rest wait for a seat, without shared blocks
                self.add(parent.fork(i, 0))
                continue
            child = parent.fork(i, shared * bs)
            self.bm.share(parent, child, shared)
            self.slots.retain(child.adapter)
            child.slot = parent.slot
            child.status = SeqStatus.RUNNING
            child.enqueued_at = parent.enqueued_at
            self.running.append(child)
        parent.pending_forks = 0
        self.num_forks += 1
