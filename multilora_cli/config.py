"""Configs: `@dataclass(slots=True)` that validate themselves. CLI flags map onto these fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from multilora_cli.errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")
LOAD_FORMATS = ("auto", "dummy")  # dummy = random weights of the config's shapes (benchmarks), no checkpoint read
GPU_MEMORY_UTILIZATION = 0.90  # default share of the GPU a run may use
UTILIZATION_RANGE = (0.05, 0.99)
GREEDY_BELOW = 1e-5  # temperatures under this are greedy (as in vLLM)
MAX_N = 128  # completions of one prompt (`n`), as OpenAI's limit


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling. temperature 0 = greedy. Random draws depend only on (seed, sample index, position).

    n: completions of the prompt (1..MAX_N); sample i draws from its own seed stream (engine/sequence.py
    `sample_seed`), sample 0 from the request's seed, so it is what the same request with n=1 gives."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not 0 <= self.temperature < math.inf
        ):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ConfigError(f"n must be an integer in 1..{MAX_N}, got {self.n!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        # below GREEDY_BELOW, logits / T overflows float32 (softmax of inf - inf = NaN): such a T means argmax
        self.temperature = float(self.temperature) if self.temperature >= GREEDY_BELOW else 0.0
        self.top_p = float(self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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
    seed: int = 0  # default seed for sampled requests without their own
    load_format: str = "auto"  # "dummy": random weights from config.json alone (benchmarks, sizing)
    pinned_arena: bool = True  # CUDA: packed adapters in page-locked host memory registered once (async loads)
    # background threads reading adapters into host memory ahead of their slot loads (engine/slots.py); 0 = read
    # on the step loop's thread. Reads contend for the host's copy bandwidth (a Llama-3-8B adapter packed in ~11 ms
    # alone, 27-34 / 55-63 / 145-149 ms with 1 / 3 / 6 threads beside the step loop), so more threads can read
    # slower in total: 2 was fastest on an H200 host (256 adapters in 64 slots; 3 and 4 threads were slower)
    prefetch_threads: int = 2
    # launch the next decode step before reading this one's ids back (Scheduler.schedule_ahead), so the host's
    # bookkeeping between steps overlaps the device's work; False = one step at a time (same tokens, slower)
    run_ahead: bool = True

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("a base model is required (--model)")
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
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        pt = self.prefetch_threads
        if isinstance(pt, bool) or not isinstance(pt, int) or pt < 0:
            raise ConfigError(f"prefetch_threads must be an integer >= 0, got {pt!r}")
        if not isinstance(self.run_ahead, bool):
            raise ConfigError(f"run_ahead must be true or false, got {self.run_ahead!r}")
