"""`Sequence`: one request's state inside the engine (tokens, KV blocks, status) and its sampling seed.

A sequence owns `token_ids` = prompt + generated tokens. `num_computed_tokens` of them have their KV in the
cache; a step feeds the next chunk `token_ids[num_computed_tokens : num_computed_tokens + n]`. Preemption
frees the KV and sets `num_computed_tokens` back to 0: the next prefill recomputes prompt + generated so far.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from multilora_cli.config import SamplingParams
from multilora_cli.engine.request import Request
from multilora_cli.errors import MultiloraError

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One round of SplitMix64: a bijective 64-bit mixer (uniform output bits for any input)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


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
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    slot: int = -1  # LoRA slot while RUNNING; -1 = base or not admitted
    finish_reason: str | None = None  # "stop" | "length" once FINISHED without error
    error: MultiloraError | None = None  # set when the sequence failed
    text: str = ""  # final text (set when finished by the stop checker)
    num_preemptions: int = 0
    enqueued_at: int = 0  # scheduler admission counter when (re)queued: measures how long it was deferred
    detok: Any = None  # incremental decoder for stop strings (engine.detokenizer), created lazily

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.token_ids = list(self.prompt_token_ids)

    @classmethod
    def from_request(
        cls,
        seq_id: int,
        request: Request,
        prompt_token_ids: list[int],
        engine_seed: int = 0,
        adapter: str | None = None,
    ) -> Sequence:
        """Build a sequence; the seed is the request's own or derived from (engine_seed, request.key)."""
        seed = request.sampling.seed
        if seed is None:
            seed = derive_seed(engine_seed, request.key)
        return cls(
            seq_id=seq_id,
            request=request,
            prompt_token_ids=prompt_token_ids,
            adapter=adapter if adapter is not None else request.adapter,
            seed=seed,
        )

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
