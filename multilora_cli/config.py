"""Configs: `@dataclass(slots=True)` that validate themselves. CLI flags map onto these fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from multilora_cli.constraint import Constraint
from multilora_cli.errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")
LOAD_FORMATS = ("auto", "dummy")  # dummy = random weights of the config's shapes (benchmarks), no checkpoint read
# --quantization: "fp8" quantizes a bf16 / fp16 / fp32 base's decoder projections to FP8 while loading (an FP8
# checkpoint is FP8 whatever the flag says)
QUANTIZATIONS = ("none", "fp8")
# FP8 layers: from this many tokens in a step cuBLAS _scaled_mm, below it the Triton split-K FP8 kernel
# (kernels/fp8_mm.py, both operands e4m3 on the tensor cores). Measured on an H200 (`python -m benchmarks.bench_gemm
# --fp8`, one Llama-3-8B layer's four GEMMs, us, bf16 / _scaled_mm / Triton): 1 token 132 / 156 / 113, 16 tokens
# 134 / 153 / 120, 64 tokens 140 / 147 / 134, 96 tokens 145 / 142 / 159; cuBLAS wins from 96 on
FP8_SMALL_M = 96
GPU_MEMORY_UTILIZATION = 0.90  # default share of the GPU a run may use
UTILIZATION_RANGE = (0.05, 0.99)
GREEDY_BELOW = 1e-5  # temperatures under this are greedy (as in vLLM)
MAX_LOGPROBS = 20  # most alternatives per token (`logprobs`, `prompt_logprobs`; OpenAI allows 20 too)
MAX_N = 128  # completions of one prompt (`n`), as OpenAI's limit


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling. temperature 0 = greedy. Random draws depend only on (seed, sample index, position).

    n: completions of the prompt (1..MAX_N); sample i draws from its own seed stream (engine/sequence.py
    `sample_seed`), sample 0 from the request's seed, so it is what the same request with n=1 gives.

    Logits processing, each with the semantics of the system users know it from, in this order on the raw
    logits (engine/logits_processing.py): `logit_bias` (OpenAI: {token id: bias in [-100, 100]} added),
    `repetition_penalty` (transformers: over prompt + generated tokens, logit / p if > 0 else logit * p),
    `frequency_penalty` / `presence_penalty` (OpenAI: logit -= f * count + p * (count > 0), over generated
    tokens), `min_tokens` (no eos / `stop_token_ids` before that many generated tokens: their logits -inf, as
    transformers' min_new_tokens and vLLM). Then temperature, top-k, top-p and `min_p` (transformers: keep the
    tokens whose probability is >= min_p times the top one's). `stop_token_ids` end a completion like eos.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id (int or its decimal string) -> bias
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    n: int = 1
    constraint: Constraint | None = None  # structured output (constraint.py; engine/grammar/)
    # the model's own log-softmax (fp32, raw logits: before logits processing, temperature, top-k/p), vLLM's
    # default: `logprobs` k -> each generated token's logprob and the k most likely; `prompt_logprobs` k -> the
    # same for every prompt token after the first (engine/logprobs.py). None = not asked (nothing is computed)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ConfigError(f"constraint must be a Constraint, got {self.constraint!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ConfigError(f"n must be an integer in 1..{MAX_N}, got {self.n!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty < math.inf:
            raise ConfigError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2 <= v <= 2:
                raise ConfigError(f"{name} must be a number in [-2, 2], got {v!r}")
        self.logit_bias = _logit_bias(self.logit_bias)
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ConfigError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ConfigError(f"min_tokens must be <= max_tokens, got {self.min_tokens} > {self.max_tokens}")
        ids = self.stop_token_ids
        if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ConfigError(f"stop_token_ids must be a list of token ids (integers >= 0), got {ids!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or not 0 <= v <= MAX_LOGPROBS):
                raise ConfigError(f"{name} must be an integer in 0..{MAX_LOGPROBS}, got {v!r}")
        # below GREEDY_BELOW, logits / T overflows float32 (softmax of inf - inf = NaN): such a T means argmax
        self.temperature = float(self.temperature) if self.temperature >= GREEDY_BELOW else 0.0
        self.top_p = float(self.top_p)
        self.min_p = float(self.min_p)
        self.repetition_penalty = float(self.repetition_penalty)
        self.frequency_penalty = float(self.frequency_penalty)
        self.presence_penalty = float(self.presence_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """Whether the logits depend on the tokens seen so far (a penalty is on)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether any logits processing may apply (penalties, logit_bias, min_tokens): else the raw logits are
        sampled as they are."""
        return self.needs_history or bool(self.logit_bias) or self.min_tokens > 0

    def check_token_ids(self, vocab_size: int) -> None:
        """Token ids named by logit_bias and stop_token_ids must be in the model's vocabulary [0, vocab_size)."""
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ConfigError(
                    f"{name} names token id {bad[0]}, outside the model's vocabulary (ids 0..{vocab_size - 1})"
                )


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _logit_bias(bias) -> dict[int, float]:
    """OpenAI's logit_bias {token id: bias}: keys ints or their decimal strings (JSON object keys are strings),
    biases finite numbers in [-100, 100] -> {int: float}."""
    if not isinstance(bias, dict):
        raise ConfigError(f"logit_bias must be an object mapping token ids to biases, got {bias!r}")
    out: dict[int, float] = {}
    for k, v in bias.items():
        t = k if _is_int(k) else int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else None
        if t is None or t < 0:
            raise ConfigError(f"logit_bias keys must be token ids (integers >= 0), got {k!r}")
        if not _is_number(v) or not -100 <= v <= 100:
            raise ConfigError(f"logit_bias values must be numbers in [-100, 100], got {v!r} for token {k!r}")
        if t in out:
            raise ConfigError(f"logit_bias names token {t} twice")
        out[t] = float(v)
    return out


@dataclass(frozen=True, slots=True)
class LineKind:
    """What one input line asks of the kernels after the model's forward (run/line_kinds.py reads them off a
    file's lines before the engine starts): the engine precompiles the sampler, logprob and grammar-mask variants
    of its lines' kinds only (engine/dry_sample.py), and an adapter-less forward only if a line runs the base."""

    base: bool = False  # no adapter: a step of such lines alone runs no LoRA kernel
    sampled: bool = False  # temperature > 0 and top_k != 1 (else argmax)
    top_k: int = 0  # 0 = off
    top_p: bool = False  # top_p < 1
    min_p: bool = False  # min_p > 0
    penalty: bool = False  # a repetition / frequency / presence penalty: the token counts are read
    bias: bool = False  # logit_bias: processed at every step
    min_tokens: bool = False  # processed while min_tokens bans the stop set, as it is at other steps
    logprobs: int | None = None  # k of each generated token's logprobs
    prompt_logprobs: int | None = None  # k of the prompt's (a scoring line: 0)
    constrained: bool = False  # response_format / regex / choice: the grammar mask

    @classmethod
    def of(cls, sp: SamplingParams, base: bool, scoring: bool = False) -> LineKind:
        return cls(
            base=base,
            sampled=not scoring and not sp.greedy and sp.top_k != 1,
            top_k=sp.top_k,
            top_p=sp.top_p < 1.0,
            min_p=sp.min_p > 0.0,
            penalty=sp.needs_history,
            bias=bool(sp.logit_bias),
            min_tokens=sp.min_tokens > 0,
            logprobs=None if scoring else sp.logprobs,
            prompt_logprobs=(sp.prompt_logprobs or 0) if scoring else sp.prompt_logprobs,
            constrained=sp.constraint is not None,
        )

    @property
    def processed(self) -> bool:
        """Whether the line's logits may be processed at some step (kernels/penalties.py)."""
        return self.penalty or self.bias or self.min_tokens


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine needs to start. `model` is a resolved local directory."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    max_loras: int = 8  # GPU slots: distinct adapters in one step
    max_lora_rank: int = 64
    max_cpu_loras: int = 64  # adapters kept in host memory (packed, engine/packed.py)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # token budget per step (prefill chunks + decodes)
    max_model_len: int | None = None  # None = from the model config
    block_size: int = 16  # KV cache block (tokens)
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    cpu_kv_cache_bytes: int = 1 << 30  # KV budget when running on CPU
    num_kv_blocks: int | None = None  # fixed KV size (tests, benchmarks); None = size from memory
    enforce_eager: bool = False  # no CUDA graphs
    # most sequences the input can decode at once (io/reader.count_sequences; None = unknown): CUDA graphs are
    # captured, and their kernels compiled, only for the buckets up to it (a 14-line job needs 5 of 20)
    max_decode_batch: int | None = None
    # estimated upper bound on the input's prompt tokens (io/reader.prompt_token_bound; None = unknown): the
    # precompile dry-runs prefill steps only up to it plus max_decode_batch (a 14-line job: one size, not six);
    # a larger step still runs, compiling its kernels when it comes
    prompt_tokens_hint: int | None = None
    # capture each decode graph at the first step of its bucket instead of all at start: the first token comes
    # sooner and a run captures only what it reaches (benchmarks capture at start to time steady steps)
    lazy_capture: bool = True
    # the distinct LineKinds of the input's lines (run/line_kinds.py; None = unknown): the precompile dry-runs
    # the sampler, logprob and mask variants those can launch, no others (the demo: 8 sampling variants, not 19)
    line_kinds: frozenset[LineKind] | None = None
    seed: int = 0  # default seed for sampled requests without their own
    load_format: str = "auto"  # "dummy": random weights from config.json alone (benchmarks, sizing)
    pinned_arena: bool = True  # CUDA: packed adapters in page-locked host memory registered once (async loads)
    # background threads reading adapters into host memory ahead of their slot loads (engine/slots.py); 0 = read
    # on the step loop's thread. Reads contend for the host's copy bandwidth (a Llama-3-8B adapter packed in ~11 ms
    # alone, 27-34 / 55-63 / 145-149 ms with 1 / 3 / 6 threads beside the step loop), so more threads can read
    # slower in total: 2 was fastest on an H200 host (256 adapters in 64 slots; 3 and 4 threads were slower)
    prefetch_threads: int = 2
    # threads that copy one adapter's file pieces from the page cache in parallel (engine/direct_read.py); one
    # thread copies at a fraction of the host's bandwidth, and a MoE adapter is ~1.7 GB; 1 = the reader alone
    read_threads: int = 8
    # launch the next decode step before reading this one's ids back (Scheduler.schedule_ahead), so the host's
    # bookkeeping between steps overlaps the device's work; False = one step at a time (same tokens, slower)
    run_ahead: bool = True
    quantization: str = "none"  # one of QUANTIZATIONS
    fp8_small_m: int = FP8_SMALL_M  # FP8 bases: tokens from which a step's GEMMs run in cuBLAS _scaled_mm
    # reuse the KV of full prompt blocks already computed under the same adapter (engine/prefix_cache.py) and
    # order each adapter's queue by shared prefix; False = every prompt computed in full, queues in arrival order
    prefix_cache: bool = True

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("a base model is required (--model)")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if isinstance(self.fp8_small_m, bool) or not isinstance(self.fp8_small_m, int) or self.fp8_small_m < 0:
            raise ConfigError(f"fp8_small_m must be an integer >= 0, got {self.fp8_small_m!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        for name in (
            "max_loras",
            "max_lora_rank",
            "max_cpu_loras",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_cpu_loras < self.max_loras:
            self.max_cpu_loras = self.max_loras
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        lo, hi = UTILIZATION_RANGE
        if not lo <= self.gpu_memory_utilization <= hi:
            raise ConfigError(f"gpu_memory_utilization must be in [{lo}, {hi}], got {self.gpu_memory_utilization}")
        if self.max_decode_batch is not None and self.max_decode_batch < 1:
            raise ConfigError(f"max_decode_batch must be >= 1, got {self.max_decode_batch}")
        if self.prompt_tokens_hint is not None and self.prompt_tokens_hint < 0:
            raise ConfigError(f"prompt_tokens_hint must be >= 0, got {self.prompt_tokens_hint}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        pt = self.prefetch_threads
        if isinstance(pt, bool) or not isinstance(pt, int) or pt < 0:
            raise ConfigError(f"prefetch_threads must be an integer >= 0, got {pt!r}")
        rt = self.read_threads
        if isinstance(rt, bool) or not isinstance(rt, int) or rt < 1:
            raise ConfigError(f"read_threads must be an integer >= 1, got {rt!r}")
        lk = self.line_kinds
        if lk is not None and (not isinstance(lk, frozenset) or not all(isinstance(k, LineKind) for k in lk)):
            raise ConfigError(f"line_kinds must be a frozenset of LineKind or None, got {lk!r}")
        if not isinstance(self.lazy_capture, bool):
            raise ConfigError(f"lazy_capture must be true or false, got {self.lazy_capture!r}")
        if not isinstance(self.run_ahead, bool):
            raise ConfigError(f"run_ahead must be true or false, got {self.run_ahead!r}")
        if not isinstance(self.prefix_cache, bool):
            raise ConfigError(f"prefix_cache must be true or false, got {self.prefix_cache!r}")
