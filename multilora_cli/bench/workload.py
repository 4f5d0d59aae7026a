"""`Workload`: what one benchmark row runs (model shape, adapters, requests), and its deterministic requests."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from multilora_cli.bench.model_dir import PRESETS
from multilora_cli.config import FP8_SMALL_M, MAX_N, QUANTIZATIONS, SamplingParams
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import sample_seed
from multilora_cli.errors import ConfigError

DISTRIBUTIONS = ("uniform", "zipf", "round")  # round: prompt i -> adapter i % num_adapters (equal groups)

# Workload field -> the `multilora bench` flag that sets it, so every error names what the user typed. Fields no
# flag sets (seed, zipf_s, ...) keep their own name.
FLAGS = {
    "preset": "--preset",
    "num_adapters": "--num-adapters",
    "rank": "--rank",
    "max_loras": "--max-loras",
    "num_requests": "--requests",
    "prompt_len": "--prompt-len",
    "output_len": "--output-len",
    "distribution": "--distribution",
    "max_num_seqs": "--max-num-seqs",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "quantization": "--quantization",
    "fp8_small_m": "--fp8-small-m",
    "distinct_weights": "--distinct-weights",
    "shared_prefix_len": "--shared-prefix",
}


def flag(name: str) -> str:
    """The flag that sets Workload field `name` (the field name where there is none)."""
    return FLAGS.get(name, name)


@dataclass(slots=True)
class Workload:
    """One row's workload. num_adapters 0 = base model only (every request adapter-less).

    preset: model shape (bench.model_dir.PRESETS), rank: LoRA rank on all 7 projections, max_loras: GPU slots
    (None = multilora run's default, sized from the device's memory and num_adapters), distribution: how requests spread over adapters (zipf exponent zipf_s),
    temperature / top_p: 0 = greedy, else seeded sampling (request i draws with seed `seed + i`).
    n: samples per prompt; num_requests counts completions, so there are num_requests // n prompts (adapters are
    drawn per prompt), each one request with n samples, or with `separate_n` n separate requests of the same
    prompt, drawing the same texts (request j of prompt i has the seed of sample j: engine/sequence.sample_seed):
    the pair of rows measures what sharing the prompt's prefill is worth.
    shared_prefix_len: tokens of a prefix shared by every prompt of one adapter (one for all base prompts), put
    before each prompt's own prompt_len tokens (the prefix cache's workload); prefix_cache: EngineConfig's.
    """

    preset: str = "llama-3-8b"
    num_adapters: int = 64
    rank: int = 16
    max_loras: int | None = None
    num_requests: int = 1024
    prompt_len: int = 128
    output_len: int = 128
    distribution: str = "uniform"
    zipf_s: float = 1.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    seed: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    separate_n: bool = False
    quantization: str = "none"  # "fp8": the base's decoder projections in FP8 (random weights drawn FP8)
    fp8_small_m: int = FP8_SMALL_M  # FP8: tokens from which cuBLAS _scaled_mm serves a step (EngineConfig's)
    # distinct weight files the synthetic adapters are written from (bench/adapters.py); the others hard-link one
    # round-robin, so the OS page cache serves their reads (each is still packed into its own host cache block)
    distinct_weights: int = 64
    shared_prefix_len: int = 0
    prefix_cache: bool = True
    read_threads: int = 8  # EngineConfig.read_threads: threads copying one adapter's file pieces

    def __post_init__(self) -> None:
        if self.preset.strip().lower() not in PRESETS:  # before anything sizes a model or picks a device
            raise ConfigError(
                f"{flag('preset')} {self.preset!r} is not a known model shape",
                hint=f"choose one of {', '.join(sorted(PRESETS))}",
            )
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"{flag('quantization')} must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.fp8_small_m < 0:
            raise ConfigError(f"{flag('fp8_small_m')} must be >= 0, got {self.fp8_small_m}")
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(
                f"{flag('distribution')} must be one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}"
            )
        for name in ("num_requests", "prompt_len", "output_len", "rank", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        if self.shared_prefix_len < 0:
            raise ConfigError(f"{flag('shared_prefix_len')} must be >= 0, got {self.shared_prefix_len}")
        if not 1 <= self.n <= min(MAX_N, self.num_requests):
            raise ConfigError(f"n must be in 1..{MAX_N} and at most {flag('num_requests')}, got {self.n}")
        if self.num_adapters < 0:
            raise ConfigError(f"{flag('num_adapters')} must be >= 0, got {self.num_adapters}")
        # None: `multilora run`'s default (engine/slot_budget.choose_max_loras), resolved on the device by
        # bench/suite.resolve_slots; an explicit 0 is an error, not "unset"
        if self.max_loras is not None and self.max_loras < 1:
            raise ConfigError(
                f"{flag('max_loras')} must be >= 1 (GPU adapter slots), got {self.max_loras}",
                hint="leave it out for multilora run's default (sized from memory and the adapters)",
            )
        if self.distinct_weights < 1:
            raise ConfigError(f"{flag('distinct_weights')} must be >= 1, got {self.distinct_weights}")
        try:
            SamplingParams(temperature=self.temperature, top_p=self.top_p)  # the same checks as a request's
        except ConfigError as e:  # its messages start with the field name: "top_p must be ..."
            field, _, rest = e.message.partition(" ")
            raise ConfigError(f"{flag(field)} {rest}", hint=e.hint) from None

    @property
    def num_prompts(self) -> int:
        return self.num_requests // self.n

    @property
    def adapter_names(self) -> list[str]:
        return [f"lora{i}" for i in range(self.num_adapters)]

    def assignment(self) -> list[str | None]:
        """Adapter of each prompt (None = base): uniform round-robin-free random draw, or zipf over adapters."""
        if self.num_adapters == 0:
            return [None] * self.num_prompts
        rng = np.random.default_rng(self.seed)
        if self.distribution == "round":
            idx = np.arange(self.num_prompts) % self.num_adapters
        elif self.distribution == "uniform":
            idx = rng.integers(0, self.num_adapters, self.num_prompts)
        else:
            w = 1.0 / np.arange(1, self.num_adapters + 1) ** self.zipf_s
            idx = rng.choice(self.num_adapters, self.num_prompts, p=w / w.sum())
        names = self.adapter_names
        return [names[i] for i in idx]

    @property
    def total_prompt_len(self) -> int:
        """Tokens of each prompt: the shared prefix and its own."""
        return self.shared_prefix_len + self.prompt_len

    def prompts(self, vocab_size: int) -> list[list[int]]:
        """Random prompt ids in [10, vocab) (clear of the usual special ids), one list per prompt; with
        shared_prefix_len, each starts with its adapter's prefix (drawn per adapter, the base's its own)."""
        rng = np.random.default_rng(self.seed + 1)
        own = rng.integers(10, vocab_size, (self.num_prompts, self.prompt_len)).tolist()
        if not self.shared_prefix_len:
            return own
        names = [None, *self.adapter_names]
        heads = np.random.default_rng(self.seed + 2).integers(10, vocab_size, (len(names), self.shared_prefix_len))
        head_of = {a: h.tolist() for a, h in zip(names, heads)}
        return [head_of[a] + p for a, p in zip(self.assignment(), own)]

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    def requests(self, vocab_size: int) -> list[Request]:
        """Requests of exactly output_len tokens (ignore_eos): greedy, or sampled with one seed per prompt (and
        per sample: `n`)."""
        n = 1 if self.separate_n else self.n

        def sp(seed: int) -> SamplingParams:
            if not self.sampled:
                return greedy
            return SamplingParams(
                max_tokens=self.output_len,
                ignore_eos=True,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=seed,
                n=n,
            )

        greedy = SamplingParams(max_tokens=self.output_len, ignore_eos=True, n=n)
        prompts = zip(self.prompts(vocab_size), self.assignment())
        if not self.separate_n:
            return [
                Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=sp(self.seed + i))
                for i, (p, a) in enumerate(prompts)
            ]
        return [
            Request(
                key=i * self.n + j,
                id=str(i * self.n + j),
                adapter=a,
                prompt_token_ids=p,
                sampling=sp(sample_seed(self.seed + i, j)),
            )
            for i, (p, a) in enumerate(prompts)
            for j in range(self.n)
        ]

    def to_dict(self) -> dict:
        return asdict(self)
