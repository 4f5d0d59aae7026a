"""`Sequence`: one sample of a request inside the engine (tokens, KV blocks, status) and its sampling seed.

A sequence owns `token_ids` = prompt + generated tokens. `num_computed_tokens` of them have their KV in the
cache; a step feeds the next chunk `token_ids[num_computed_tokens : num_computed_tokens + n]`. Preemption
frees the KV and sets `num_computed_tokens` back to 0: the next prefill recomputes prompt + generated so far.

A request with n > 1 samples enters as ONE sequence (sample 0, seq_ids seq_id .. seq_id + n - 1 reserved for
its samples) carrying `pending_forks` = n - 1. When its whole prompt is computed and it samples its first
token, the scheduler forks samples 1 .. n-1 (`fork`): each starts with the prompt's full blocks shared
(engine/block_manager.py) and computes only the prompt's last, partial block itself before sampling its own
first token. Sample i draws from `sample_seed(seed, i)`: sample 0 from the request's own seed, so it is what the
request with n=1 gives, and sample i's text depends only on (seed, i, position).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from multilora_cli.config import SamplingParams
from multilora_cli.engine.request import Request
from multilora_cli.errors import MultiloraError

if TYPE_CHECKING:
    from multilora_cli.engine.identities import PendingIdentity

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One round of SplitMix64: a bijective 64-bit mixer (uniform output bits for any input)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


_SAMPLE_DOMAIN = 0x6E5F73616D706C65  # "n_sample": sample seeds never coincide with derive_seed's request seeds


def sample_seed(seed: int, index: int) -> int:
    """Seed of sample `index` of a request whose seed is `seed`: `seed` itself for sample 0 (what n=1 draws),
    else a mix of (seed, index) alone, so a sample's draws never depend on n or on the other samples."""
    if index == 0:
        return seed
    return splitmix64(splitmix64(seed & _MASK64) ^ splitmix64(_SAMPLE_DOMAIN + index))


def derive_seed(engine_seed: int, key: int) -> int:
    """Seed for a request without its own: a function of (engine seed, request key) only, so a resumed or
    re-ordered run samples the same text for the same input line."""
    return splitmix64(splitmix64(engine_seed & _MASK64) ^ (key & _MASK64))


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted and waiting to be recomputed)
    RUNNING = "running"  # admitted: holds KV blocks and a pin on its adapter's slot
    FINISHED = "finished"  # done (finish_reason) or failed (error)


@dataclass(slots=True, eq=False)
class Sequence:
    """Engine-side state of one request. `adapter` None = base model (slot -1)."""

    seq_id: int
    request: Request
    prompt_token_ids: list[int]
    adapter: str | None = None
    seed: int = 0  # effective sampling seed (request's own, else derive_seed(engine seed, key))
    token_ids: list[int] = field(default_factory=list)  # prompt + output; filled in __post_init__
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)  # KV block ids, in position order
    num_dropped: int = 0  # sliding window: block_table[:num_dropped] released (-1, engine/block_manager.py)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    slot: int = -1  # LoRA slot while RUNNING; -1 = base or not admitted
    finish_reason: str | None = None  # "stop" | "length" once FINISHED without error
    error: MultiloraError | None = None  # set when the sequence failed
    text: str = ""  # final text (set when finished by the stop checker)
    num_preemptions: int = 0
    enqueued_at: int = 0  # scheduler admission counter when (re)queued: measures how long it was deferred
    detok: Any = None  # incremental decoder for stop strings (engine.detokenizer), created lazily
    sample_index: int = 0  # which of the request's n samples this is
    pending_forks: int = 0  # samples still to fork from this one (n - 1 until its first token, then 0)
    reserved_seats: int = 0  # seats held for those forks while RUNNING (Scheduler: max_num_seqs counts them)
    # logprobs (engine/logprobs.py): a TokenLogprob per generated token (made as each step's ids come back) when
    # sampling.logprobs is set; prompt_lp: packed rows (numpy [2 + 2k] views), turned into entries with the result
    logprobs: list | None = None
    prompt_lp: list | None = None  # positions prompt_logits_from .. , each for the token after it
    prompt_logits_from: int = -1  # first prompt position whose logits are kept (-1: none)
    # prefix cache (engine/block_manager.py): the adapter identity its full blocks are registered and looked up
    # under (None: takes no part; a PendingIdentity while its hash runs on a worker, resolved at admission:
    # Engine._prefix_id), and the cache node of each block registered so far (block_table order)
    prefix_id: str | PendingIdentity | None = None
    cache_nodes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.token_ids = list(self.prompt_token_ids)
        if self.request.sampling.logprobs is not None:
            self.logprobs = []

    @classmethod
    def from_request(
        cls,
        seq_id: int,
        request: Request,
        prompt_token_ids: list[int],
        engine_seed: int = 0,
        adapter: str | None = None,
        context_len: int | None = None,
    ) -> Sequence:
        """Build a sequence; the seed is the request's own or derived from (engine_seed, request.key).
        context_len: a scoring request's context tokens (the rest of the prompt is its continuation)."""
        seed = request.sampling.seed
        if seed is None:
            seed = derive_seed(engine_seed, request.key)
        seq = cls(
            seq_id=seq_id,
            request=request,
            prompt_token_ids=prompt_token_ids,
            adapter=adapter if adapter is not None else request.adapter,
            seed=seed,
            pending_forks=request.sampling.n - 1,
        )
        if request.is_scoring:
            if context_len is None or not 0 < context_len < len(prompt_token_ids):
                raise ValueError("a scoring sequence needs 1 .. len(prompt) - 1 context tokens")
            seq.prompt_logits_from, seq.prompt_lp = context_len - 1, []
        elif request.sampling.prompt_logprobs is not None:
            seq.prompt_logits_from, seq.prompt_lp = 0, []  # (forks never: sample 0 gives the request's)
        return seq

    def fork(self, index: int, num_computed_tokens: int) -> Sequence:
        """Sample `index` of this sequence's request (seq_id + index), its prompt's first `num_computed_tokens`
        already in the cache (the caller shares those blocks); it samples its own first token."""
        child = Sequence(
            seq_id=self.seq_id + index,
            request=self.request,
            prompt_token_ids=self.prompt_token_ids,
            adapter=self.adapter,
            seed=sample_seed(self.seed, index),
            sample_index=index,
            prefix_id=self.prefix_id,
        )
        child.num_computed_tokens = num_computed_tokens
        return child

    # --- sizes -------------------------------------------------------------------------------------------------
    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to feed before the next token can be sampled (1 for a decode, more for a prefill)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True while more than one token is pending (a new prompt, a chunk of one, or a recompute)."""
        return self.num_uncomputed_tokens > 1

    @property
    def sample_position(self) -> int:
        """Index (within the completion) of the next token to sample: the sampler's noise counter. It does not
        change when the sequence is preempted and recomputed, so preemption never changes the text."""
        return self.num_completion_tokens

    @property
    def prefill_only(self) -> bool:
        """A scoring (or generate False) sequence: it finishes once its prompt is computed, sampling nothing."""
        return self.request.prefill_only

    def prompt_logit_positions(self, start: int, n: int) -> range:
        """Positions among start .. start + n - 1 whose logits this sequence still needs (each gives the logprob
        of the prompt token after it); a recompute after preemption skips those it already has."""
        if self.prompt_lp is None:
            return range(0)
        lo = max(start, self.prompt_logits_from + len(self.prompt_lp))
        return range(lo, min(start + n, len(self.prompt_token_ids) - 1))

    @property
    def may_take_hits(self) -> bool:
        """Whether its first prefill may start from cached blocks: not when it needs its prompt positions'
        logits (prompt_logprobs, scoring: each must then be computed), nor when `Request.prefix_hits` is off."""
        return self.request.prefix_hits and not self.request.needs_prompt_logits

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    # --- transitions -------------------------------------------------------------------------------------------
    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, key={self.request.key}, adapter={self.adapter!r}, "
            f"{self.status.value}, tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
