"""What goes into the engine and what comes out: `Request`, `Result` (with its `Sample`s), `EngineStats`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from multilora_cli.config import SamplingParams
from multilora_cli.errors import MultiloraError
from multilora_cli.tally import AdapterTally, tally_of


@dataclass(slots=True)
class Request:
    """One generation request. Exactly one of prompt / messages / prompt_token_ids is set.

    `key` is unique within a run (the writer's ordering key, e.g. the input line index); `adapter` None = base.
    """

    key: int
    id: str
    adapter: str | None = None
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # a scoring request (no generation): the text whose tokens after `prompt` are scored (engine/scoring.py)
    continuation: str | None = None
    generate: bool = True  # False: prefill only (OpenAI `echo` with max_tokens 0)
    echo: bool = False  # the Result carries the prompt's text (OpenAI completions' `echo`)
    # whether its prompt may start from prefix-cache hits (Sequence.may_take_hits also refuses them when the
    # logits of its prompt positions are needed: a hit skips computing them). Its blocks are registered anyway.
    prefix_hits: bool = True

    @property
    def is_scoring(self) -> bool:
        """A scoring request: the continuation's logprobs, no token sampled."""
        return self.continuation is not None

    @property
    def prefill_only(self) -> bool:
        """Runs its prompt and samples nothing (scoring, or generate False)."""
        return self.continuation is not None or not self.generate

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether the logits of prompt positions are needed (prompt_logprobs, scoring): such a request must
        compute every prompt position itself (a prefix-cache hit would skip positions whose logits it needs)."""
        return self.continuation is not None or self.sampling.prompt_logprobs is not None


@dataclass(slots=True)
class TokenLogprob:
    """One token's log-probability under the model (fp32 log-softmax of the raw logits) and the `top` k most
    likely tokens at that position as (id, token text, logprob), most likely first. `token`: the id's text."""

    id: int
    logprob: float | None
    top: list[tuple[int, str, float]] = field(default_factory=list)
    token: str = ""


@dataclass(slots=True)
class Score:
    """A scoring request's outcome: the continuation's tokens' logprobs (`token_logprobs`), their sum
    (`logprob`), and whether every one of them is the argmax of its position (`is_greedy`)."""

    logprob: float
    is_greedy: bool
    token_logprobs: list[float]

    @property
    def num_tokens(self) -> int:
        return len(self.token_logprobs)


@dataclass(slots=True)
class Sample:
    """One of a request's n completions (`index` 0 .. n-1)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length"
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per token id (sampling.logprobs set), else None


@dataclass(slots=True)
class Result:
    """Outcome of one request, returned once all its samples finished; `error` set means it failed (one of its
    samples did) and the other outputs are empty.

    `samples` holds every completion in index order (one for n=1); `text`, `token_ids` and `finish_reason` are
    sample 0's, `completion_tokens` the sum over the samples, `prompt_tokens` the prompt's (prefilled once).
    A scoring request has `score` and no samples."""

    key: int
    id: str
    adapter: str | None
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: MultiloraError | None = None
    samples: list[Sample] = field(default_factory=list)
    # one per prompt token; the first has no logprob (nothing predicts it): logprob None, no top
    prompt_logprobs: list[TokenLogprob] | None = None
    echo_text: str | None = None  # the prompt's text, when the request asked for `echo`
    score: Score | None = None  # a scoring request's


@dataclass(slots=True)
class EngineStats:
    """Counters the engine keeps while generating; `to_dict` feeds the run's stats JSON."""

    model: str = ""
    device: str = ""
    dtype: str = ""
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    ahead_steps: int = 0  # decode steps launched before the previous step's ids were read (EngineConfig.run_ahead)
    preemptions: int = 0
    slot_loads: int = 0
    slot_hits: int = 0
    slot_evictions: int = 0
    max_loras: int = 0
    max_lora_rank: int = 0
    # prefix cache (engine/block_manager.py): tokens of the sequences started from nothing (each prompt, plus the
    # tokens of a preempted sequence's recompute), and of those the tokens whose KV came from the cache
    prefix_prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    wall_seconds: float = 0.0
    per_adapter: dict[str, AdapterTally] = field(default_factory=dict)  # generated results (errors not kept)

    def adapter(self, name: str | None) -> AdapterTally:
        return tally_of(self.per_adapter, name)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["per_adapter"] = {k: v.to_dict(errors=False) for k, v in self.per_adapter.items()}
        total = self.prompt_tokens + self.completion_tokens
        d["tokens_per_second"] = total / self.wall_seconds if self.wall_seconds > 0 else 0.0
        d["completion_tokens_per_second"] = self.completion_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0
        d["prefix_cache"] = prefix_cache_stats(self.prefix_prompt_tokens, self.prefix_hit_tokens)
        return d


def prefix_cache_stats(prompt_tokens: int, hit_tokens: int) -> dict:
    """The stats' "prefix_cache" section: {"prompt_tokens", "hit_tokens", "hit_rate"} (hit_rate 0 without tokens)."""
    rate = hit_tokens / prompt_tokens if prompt_tokens else 0.0
    return {"prompt_tokens": prompt_tokens, "hit_tokens": hit_tokens, "hit_rate": rate}
