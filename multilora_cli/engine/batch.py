"""`ScheduledBatch`: what one engine step runs, and the flat per-token lists the runner turns into tensors.

Sequence i feeds `num_new_tokens[i]` tokens at positions `start[i] .. start[i] + num_new_tokens[i] - 1`
(`start[i]` = its num_computed_tokens when scheduled). Its KV for those positions is written into the slots of
its block table; attention for these queries covers positions 0 .. start[i] + num_new_tokens[i] - 1.
`seqs[:num_decodes]` have exactly one new token each (decodes, or a one-token prompt), the rest are prefill
chunks. `sample[i]` says whether the last fed token's logits are needed (a decode or the final prefill chunk).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multilora_cli.engine.sequence import Sequence


@dataclass(slots=True)
class ScheduledBatch:
    """One step's plan. All per-sequence lists are aligned with `seqs`."""

    seqs: list[Sequence]
    num_new_tokens: list[int]
    start: list[int]  # num_computed_tokens of each sequence before this step
    slots: list[int]  # LoRA slot of each sequence (-1 = base)
    sample: list[bool]  # logits needed for this sequence's last token this step
    num_decodes: int  # seqs[:num_decodes] have one new token each
    block_size: int
    preempted: list[Sequence] = field(default_factory=list)  # sequences preempted while planning this step
    # decodes fed the token the previous step samples, not yet on the host (Scheduler.schedule_ahead): the
    # runner takes those ids from the device; `input_ids` holds placeholders for them
    ahead: bool = False

    # --- sizes -----------------------------------------------------------------------------------------------
    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_sampled(self) -> int:
        return sum(self.sample)

    @property
    def is_decode_only(self) -> bool:
        return self.num_decodes == len(self.seqs)

    @property
    def num_adapters(self) -> int:
        """Distinct adapters in this step (base counts as one)."""
        return len({s.adapter for s in self.seqs})

    # --- flat per-token lists (length num_tokens, sequence-major) ------------------------------------------
    def input_ids(self) -> list[int]:
        if self.ahead:
            return [0] * self.num_tokens
        out: list[int] = []
        for seq, s, n in zip(self.seqs, self.start, self.num_new_tokens):
            out.extend(seq.token_ids[s : s + n])
        return out

    def positions(self) -> list[int]:
        out: list[int] = []
        for s, n in zip(self.start, self.num_new_tokens):
            out.extend(range(s, s + n))
        return out

    def kv_slot_mapping(self) -> list[int]:
        """Cache slot (block * block_size + offset) that each fed token's KV is written to."""
        bs = self.block_size
        out: list[int] = []
        for seq, s, n in zip(self.seqs, self.start, self.num_new_tokens):
            table = seq.block_table
            out.extend(table[p // bs] * bs + p % bs for p in range(s, s + n))
        return out

    def token_lora_slots(self) -> list[int]:
        """LoRA slot of every fed token (-1 = base): input of the kernels' metadata build."""
        out: list[int] = []
        for slot, n in zip(self.slots, self.num_new_tokens):
            out.extend([slot] * n)
        return out

    # --- per-sequence lists ---------------------------------------------------------------------------------
    def query_start_loc(self) -> list[int]:
        """Cumulative query lengths, length num_seqs + 1 (cu_seqlens_q)."""
        out = [0]
        for n in self.num_new_tokens:
            out.append(out[-1] + n)
        return out

    def seq_lens(self) -> list[int]:
        """Context length of each sequence after this step's tokens are written (keys attended to)."""
        return [s + n for s, n in zip(self.start, self.num_new_tokens)]

    def block_tables(self) -> list[list[int]]:
        return [list(seq.block_table) for seq in self.seqs]

    def logits_indices(self) -> list[int]:
        """Flat token index whose hidden state goes to the LM head, one per sampled sequence, in order."""
        out, pos = [], 0
        for n, smp in zip(self.num_new_tokens, self.sample):
            pos += n
            if smp:
                out.append(pos - 1)
        return out

    def sampled_seqs(self) -> list[Sequence]:
        """Sequences that get a token this step, in the order `postprocess` expects their ids."""
        return [seq for seq, smp in zip(self.seqs, self.sample) if smp]


class StepPlan:
    """A step while the scheduler builds it: sequences with their new-token counts and the budget left."""

    def __init__(self, budget: int):
        self.budget = budget
        self.seqs: list[Sequence] = []
        self.n_new: list[int] = []
        self.ids: set[int] = set()  # seq_ids already in the step
        self.preempted: list[Sequence] = []
        self.num_prefills = 0

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.n_new.append(n)
        self.ids.add(seq.seq_id)
        self.budget -= n
        self.num_prefills += n > 1

    def to_batch(self, block_size: int) -> ScheduledBatch:
        """Freeze into a batch, one-token entries first (stable), before any token is computed."""
        seqs, n_new = self.seqs, self.n_new
        # a stable partition (n >= 1, so n != 1 is a prefill chunk); a step of decodes only is in order already
        if self.num_prefills:
            order = [i for i, n in enumerate(n_new) if n == 1] + [i for i, n in enumerate(n_new) if n != 1]
            seqs = [seqs[i] for i in order]
            n_new = [n_new[i] for i in order]
        start = [s.num_computed_tokens for s in seqs]
        return ScheduledBatch(
            seqs=seqs,
            num_new_tokens=n_new,
            start=start,
            slots=[s.slot for s in seqs],
            # a scoring sequence samples nothing: its last chunk finishes it (Scheduler.postprocess)
            sample=[st + n == len(s.token_ids) and not s.prefill_only for s, st, n in zip(seqs, start, n_new)],
            num_decodes=len(seqs) - self.num_prefills,
            block_size=block_size,
            preempted=self.preempted,
        )
