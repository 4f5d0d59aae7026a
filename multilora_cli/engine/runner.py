"""`ModelRunner`: owns the model, its KV cache and LoRA slots on one device; runs one scheduled step.

Per step it builds the metadata ONCE (token ids, positions, KV slots, attention context, LoRA segments), runs
the model over the flat token batch, takes the logits of the sequences that sample, and samples. On CUDA,
decode-only steps replay CUDA graphs captured at bucketed batch sizes (engine/cuda_graphs.py); prefill and
mixed steps run eagerly from one packed host->device copy (engine/step_inputs.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.cuda_graphs import DecodeGraphs
from multilora_cli.engine.device import resolve_device
from multilora_cli.engine.logits_processing import TokenHistory
from multilora_cli.engine.logprobs import PromptRows, StepLogprobs, logprob_rows, prompt_logprobs, sampled_plan
from multilora_cli.engine.long_rope import crossings, long_mask, recompute_batches
from multilora_cli.engine.precompile import precompile
from multilora_cli.engine.sampler import Sampler, SamplingBatch
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.engine.staging import DeviceStager
from multilora_cli.engine.step_inputs import build_step_inputs
from multilora_cli.errors import EngineError
from multilora_cli.kernels import LoraMetaBuffers, build_lora_meta, driver_warm
from multilora_cli.kernels.compile_log import compile_log
from multilora_cli.layers.context import reset_context, set_context
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model, resolve_dtype
from multilora_cli.models.quantization import ONLINE

# device copies of packed adapters made ahead of their slot loads (engine/staging.py): at most 8, within 1 GiB of
# GPU memory, at least 2. 8 buffers let more loads find their copy made (H200, Llama-3-8B rank 16: 11,440 vs
# 11,101 tok/s with 2, 64 adapters cold; 7,751 vs 7,399 with 256 adapters in 64 slots)
STAGING_BUFFERS = 8
STAGING_BYTES = 1 << 30


def staging_buffers(slot_bytes: int) -> int:
    """How many staging buffers of `slot_bytes` (one slot of every LoRA layer) to keep: 8 rank-16 Llama-3-8B
    slots (84 MB each), 3 at rank 64 (336 MB)."""
    return max(2, min(STAGING_BUFFERS, STAGING_BYTES // max(slot_bytes, 1)))


def input_kv_blocks(config: EngineConfig, max_position_embeddings: int) -> int | None:
    """KV blocks that hold every sequence the input can run (config.max_decode_batch) at max_model_len at once,
    plus 2% (the scheduler's admission watermark is 1%) and one block per sequence (a run-ahead step's slot);
    None when the input's size is unknown. More blocks could never be used: no sequence waits for KV, none is
    preempted and no cached prefix is evicted, so the results are those of a cache sized by memory. A 14-line
    demo job zeroed a 1 GiB cache on CPU for ~14 x 512 tokens (0.55 s of a 2.5 s run)."""
    if config.max_decode_batch is None:
        return None
    limit = config.max_model_len or max_position_embeddings
    blocks = config.max_decode_batch * (-(-limit // config.block_size) + 1)
    return blocks + blocks // 50 + 2


def precompile_tokens(config: EngineConfig) -> int:
    """The largest prefill step the precompile dry-runs: max_num_batched_tokens, or less when the input's prompts
    are known to be fewer tokens (config.prompt_tokens_hint, plus a decode token per sequence of a mixed step)."""
    if config.prompt_tokens_hint is None:
        return config.max_num_batched_tokens
    hint = config.prompt_tokens_hint + (config.max_decode_batch or config.max_num_seqs)
    return max(1, min(config.max_num_batched_tokens, hint))


def pick_device(requested: str) -> torch.device:
    """The torch device of `requested` ("auto" | "cuda" | "cpu", engine/device.resolve_device): CUDA is the
    current CUDA device."""
    if resolve_device(requested) == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(slots=True)
class StepRecord:
    """One step as the runner saw it (kept only when `ModelRunner.step_log` is a list: benchmarks).

    seconds: host wall time of the step (metadata build, forward, LM head, sampling, reading the ids back; a
             step launched while the one before it ran counts from that one's end, see `ModelRunner._log`);
    kv_tokens: context tokens of all sequences after the step (what decode attention reads);
    adapters: distinct LoRA slots in the step."""

    decode: bool
    graph: bool
    seqs: int
    tokens: int
    kv_tokens: int
    adapters: int
    seconds: float


@dataclass(slots=True)
class Launched:
    """A step queued on the device (`ModelRunner.launch`): ids [N] sampled on the device (None: nothing
    sampled), host: where they arrive (page-locked; the ids themselves on CPU), done: the event after that copy."""

    batch: ScheduledBatch
    ids: torch.Tensor | None
    host: torch.Tensor | None
    done: torch.cuda.Event | None
    t0: float
    graph: bool
    logprobs: StepLogprobs | None = None  # rows that asked for logprobs (engine/logprobs.py), None: none did


def _greedy(seqs) -> bool:
    """Every row is argmax of its raw logits (no row's logits are processed: see engine/sampler.py)."""
    return all((s.sampling.greedy or s.sampling.top_k == 1) and not s.sampling.processes_logits for s in seqs)


class ModelRunner:
    """Model + paged KV cache + LoRA slot tensors on one device; decode CUDA graphs on CUDA unless
    `config.enforce_eager`."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        *,
        use_lora: bool = True,
        lora_targets: set[str] | None = None,
        dora: bool = False,
        vocab: dict | None = None,
        eos_token_ids: tuple[int, ...] | list[int] = (),
    ):
        self.config = config
        self.model_config = model_config
        self.device = pick_device(config.device)
        self.dtype = resolve_dtype(model_config.torch_dtype, config.dtype, self.device)
        if self.device.type == "cuda":
            driver_warm.join()  # Triton's driver, if a run started building it early (kernels/driver_warm.py)
        # Triton's compiles vs cache loads from here on (kernels/compile_log.py; the stats' "startup")
        self._compile_log = compile_log() if self.device.type == "cuda" else None
        self._triton_start = self._compile_log.snapshot() if self._compile_log is not None else None
        self.max_loras = config.max_loras if use_lora else 0
        self.model = load_model(
            Path(config.model),
            model_config,
            dtype=self.dtype,
            device=self.device,
            max_loras=self.max_loras,
            max_lora_rank=config.max_lora_rank if use_lora else 0,
            lora_targets=lora_targets,
            load_format=config.load_format,
            seed=config.seed,
            quantization=model_config.quantization or (ONLINE if config.quantization == "fp8" else None),
            fp8_small_m=config.fp8_small_m,
        )
        self._lora_modules = self.model.lora_modules()
        self._slot_writer = SlotWriter(self._lora_modules, self.device)
        if dora and use_lora:  # some adapter of the run is DoRA: scale rows in every module, before graph capture
            self._slot_writer.enable_dora()
        # embed_tokens / lm_head adapters in the run (layers/vocab_lora.py: embed_lora, head_lora, embed_full,
        # head_full): their slots before the KV cache is sized (so it counts them) and before graph capture
        self.vocab = self._enable_vocab(vocab) if vocab and use_lora else None
        self._expert_modules = self.model.expert_lora_modules()  # MoE: {layer: MoeExperts} with LoRA slots
        if self.device.type == "cuda" and self._lora_modules:
            # allocated before the KV cache is sized, so their bytes are counted; one slot's worth each (with
            # DoRA: and the magnitudes packed behind A / B)
            numel = self._slot_writer.staged_numel
            self._slot_writer.stager = DeviceStager(
                self.device, numel, self.dtype, n_buffers=staging_buffers(numel * self.dtype.itemsize)
            )
        self.block_size = config.block_size
        self.num_blocks = self._size_kv_cache()
        self.model.allocate_kv_cache(self.num_blocks, self.block_size)
        self.vocab_size = model_config.vocab_size
        self.sampler = Sampler()
        self.eos_token_ids = tuple(eos_token_ids)  # what min_tokens bans besides a request's stop_token_ids
        # per running sequence with a penalty, its token counts on the device (allocated on first use)
        self.history = TokenHistory(config.max_num_seqs, model_config.vocab_size, self.device)
        max_step_tokens = config.max_num_batched_tokens + config.max_num_seqs
        self._meta_buffers = (
            LoraMetaBuffers(max_step_tokens, self.max_loras, self.device)
            if self.device.type == "cuda" and self.max_loras
            else None
        )
        self.grammar = None  # engine/grammar/rows.GrammarRows, set by the engine at its first constrained request
        self.step_log: list[StepRecord] | None = None  # set to [] to record every step (benchmarks)
        self._last_done = 0.0  # when the last step's ids were read (step times, `_log`)
        self.first_done: float | None = None  # when the first step's ids were read (perf_counter; startup stats)
        self._turn = 0
        self._host_ids = (
            [torch.empty(config.max_num_seqs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            if self.device.type == "cuda"
            else []
        )
        self.graphs: DecodeGraphs | None = None
        # MoE experts on CUDA run kernels/fused_moe.py: static shapes given T, no host sync, so they are captured too
        if self.device.type == "cuda" and not config.enforce_eager:
            self.graphs = DecodeGraphs(
                self.model,
                max_num_seqs=min(config.max_num_seqs, config.max_decode_batch or config.max_num_seqs),
                max_model_len=self.max_model_len,
                block_size=self.block_size,
                lora_buffers=self._meta_buffers,
                device=self.device,
                lazy=config.lazy_capture,
            )
        # every Triton kernel the run will launch, compiled in parallel now (a cold cache compiled them one by
        # one inside the graph warm-ups and the first prefill steps); the compile log tells compiles from loads
        self.precompiled, self.precompile_seconds = precompile(
            self.model,
            self.graphs,
            self._meta_buffers,
            max_num_batched_tokens=precompile_tokens(config),
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            device=self.device,
        )
        if self.graphs is not None and not self.graphs.lazy:
            self.graphs.capture()
        self._triton_ready = self._compile_log.snapshot() if self._compile_log is not None else None

    def triton_counts(self) -> dict:
        """Triton compiles and cache loads (kernels/compile_log.py) while the runner started (model load,
        precompile, eager capture: "triton_at_start") and since ("triton_in_steps": lazy captures, step sizes no
        dry run met); {} on CPU or with a Triton without the listener."""
        log = self._compile_log
        if log is None or not log.supported:
            return {}
        return {
            "triton_at_start": log.since(self._triton_start, self._triton_ready),
            "triton_in_steps": log.since(self._triton_ready),
        }

    @property
    def capture_seconds(self) -> float:
        """Seconds spent capturing decode graphs so far (at start; inside the steps with lazy capture)."""
        return self.graphs.capture_seconds if self.graphs is not None else 0.0

    def _enable_vocab(self, parts: dict):
        try:
            return self.model.enable_vocab(**parts)
        except torch.OutOfMemoryError:
            full = parts.get("embed_full", 0) + parts.get("head_full", 0)
            cfg = self.model_config
            each = cfg.vocab_size * cfg.hidden_size * self.dtype.itemsize
            raise EngineError(
                f"no GPU memory for the adapters' embed_tokens / lm_head slots ({full} full-weight copies of "
                f"{each / 2**20:.0f} MiB each for modules_to_save, plus vocabulary-sized LoRA slots)",
                hint="lower --max-loras (the copies are one per slot, up to the adapters that have them)",
            ) from None

    # --- sizing ----------------------------------------------------------------------------------------------
    def _size_kv_cache(self) -> int:
        """KV blocks: config.num_kv_blocks, else what memory allows (capped by `input_kv_blocks`)."""
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        blocks = self._memory_kv_blocks()
        cap = input_kv_blocks(self.config, self.model_config.max_position_embeddings)
        return blocks if cap is None else min(cap, blocks)

    def _memory_kv_blocks(self) -> int:
        per_block = self.model.kv_bytes_per_block(self.block_size)
        if self.device.type != "cuda":
            return max(1, self.config.cpu_kv_cache_bytes // per_block)
        free, total = torch.cuda.mem_get_info(self.device)
        # activations of the largest step: a few [T, max(I, q+2kv)] buffers plus the sampled logits
        cfg = self.model_config
        widest = max(2 * cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
        t = self.config.max_num_batched_tokens + self.config.max_num_seqs
        activations = 6 * t * widest * self.dtype.itemsize + 4 * self.config.max_num_seqs * cfg.vocab_size * 4
        budget = free - (1 - self.config.gpu_memory_utilization) * total - activations
        blocks = int(budget // per_block)
        if blocks < 1:
            raise EngineError(
                f"no GPU memory left for the KV cache ({free / 2**30:.1f} GiB free after loading the model)",
                hint="raise --gpu-memory-utilization, or lower --max-num-seqs or --max-loras",
            )
        return blocks

    @property
    def max_model_len(self) -> int:
        limit = self.config.max_model_len or self.model_config.max_position_embeddings
        return min(limit, self.num_blocks * self.block_size)

    # --- LoRA slots ------------------------------------------------------------------------------------------
    def install_adapter(self, slot: int, name: str, adapter) -> None:
        """Copy a loaded adapter (adapters.peft.LoraAdapter) into `slot` of every LoRA layer."""
        self._slot_writer.install(slot, adapter)
        vocab = getattr(adapter, "vocab", None)
        if self.vocab is not None:
            self.vocab.install(slot, vocab)
        elif vocab is not None:
            raise EngineError(
                f"internal: adapter {name!r} adapts embed_tokens / lm_head but the engine has no slots for them",
                hint="this is a bug: the engine sizes those slots from the run's adapters",
            )
        experts = getattr(adapter, "experts", {})
        for layer, module in self._expert_modules.items():
            parts = {p: experts[(layer, p)] for p in ("gate", "up", "down") if (layer, p) in experts}
            module.lora.set_slot(slot, {p: (a.to(self.device), b.to(self.device), s) for p, (a, b, s) in parts.items()})

    def stage_adapter(self, adapter) -> bool:
        """Copy a packed adapter to the device ahead of its slot load (thread-safe; the prefetch thread calls
        this). False where there is nothing to gain: on CPU, or no buffer to spare."""
        stager = self._slot_writer.stager
        return stager is not None and getattr(adapter, "flat", None) is not None and stager.stage(adapter)

    @property
    def staging_buffers(self) -> int:
        """Device staging buffers (0 without: CPU, or no LoRA)."""
        stager = self._slot_writer.stager
        return len(stager.buffers) if stager is not None else 0

    def staging_stats(self) -> dict:
        """Counters of the device staging buffers: staged, taken (slot loads that skipped the host copy),
        reclaimed, skipped; {} without them."""
        stager = self._slot_writer.stager
        return stager.stats() if stager is not None else {}

    def evict_adapter(self, slot: int, name: str) -> None:
        self._slot_writer.clear(slot)
        if self.vocab is not None:
            self.vocab.clear(slot)
        for module in self._expert_modules.values():
            module.lora.clear_slot(slot)

    # --- one step --------------------------------------------------------------------------------------------
    def run(self, batch: ScheduledBatch) -> list[int]:
        """Run `batch` through the model; returns one sampled token id per `batch.sampled_seqs()`."""
        return self.collect(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, prev: Launched | None = None) -> Launched:
        """Queue `batch` on the device and return at once; `collect` waits for its sampled ids. An `ahead` batch
        takes its input ids from `prev` (the launch before it) on the device.

        Decode-only steps replay a CUDA graph when one is captured; other steps run eagerly. Either way the
        step's metadata is built once, copied with one host->device copy (plus one for LoRA metadata), and
        the only host sync is reading the sampled ids, in `collect`.
        """
        t0 = time.perf_counter()
        feed = None
        if batch.ahead:
            if prev is None or prev.ids is None or prev.ids.shape[0] != batch.num_seqs:
                raise EngineError("internal: an ahead step needs the ids of the step before it")
            feed = prev.ids
        # the constrained rows' mask, computed on a worker thread while the forward is queued (engine/grammar/)
        mask = None
        if self.grammar is not None:
            if self.graphs is not None and self.graphs.can_run(batch):
                # a lazy capture must not run while the worker waits on the previous step's event: a capture
                # in the default (global) mode forbids other threads' CUDA calls, so capture first
                self.graphs.capture([self.graphs.bucket(batch.num_seqs)])
            read_prev = (lambda: self._read_ids(prev)) if batch.ahead else None
            mask = self.grammar.begin(batch.sampled_seqs(), read_prev)
        long_from = self.model.long_rope_from
        for i in crossings(batch, long_from):  # LongRoPE: recompute a sequence's KV long as it passes long_from
            for chunk in recompute_batches(batch, i, long_from, self.config.max_num_batched_tokens):
                self._forward_eager(chunk, np.ones(chunk.num_tokens, dtype=bool))
        rope_long = long_mask(batch, long_from)
        # prompt positions whose logits a sequence needs (prompt_logprobs, scoring): eager steps only
        prows = PromptRows.of(batch) if any(s.prompt_lp is not None for s in batch.seqs) else None
        lp = None
        graph = self.graphs is not None and rope_long is None and prows is None and self.graphs.can_run(batch)
        if graph:
            adapted = self.max_loras > 0 and any(s >= 0 for s in batch.slots)
            token_slots = batch.token_lora_slots() if adapted else None
            hidden = self.graphs.run(batch, token_slots, feed)  # [B, H]
            if batch.num_sampled != batch.num_seqs:
                keep = torch.tensor([i for i, s in enumerate(batch.sample) if s], dtype=torch.long)
                hidden = hidden.index_select(0, keep.to(self.device, non_blocking=True))
        else:
            hidden, inputs = self._forward_eager(batch, rope_long, feed)
            if prows is not None:
                lp = StepLogprobs(prompt=self._prompt_logprobs(hidden, prows), prompt_rows=prows)
            if inputs.num_logits == 0:
                return self._done(Launched(batch, None, None, None, t0, graph, lp))  # (no mask was begun)
            hidden = hidden.index_select(0, inputs.logits_rows)
        seqs = batch.sampled_seqs()
        if not seqs:
            return self._done(Launched(batch, None, None, None, t0, graph, lp))
        # each row's slot, for lm_head adapters (layers/vocab_lora.py); None: the head is the base's for every row
        row_slots = np.asarray([s.slot for s in seqs]) if self.vocab is not None and self.vocab.adapts_head else None
        logits = self.model.compute_logits(hidden, upcast=False, slots=row_slots)  # [N, V] model dtype
        if mask is None and _greedy(seqs):
            # the sampler's greedy rows without its bookkeeping; argmax over the model-dtype logits picks the
            # index an fp32 copy would (the upcast is exact) and skips a [N, V] fp32 write (256 x 128k: ~50 us)
            ids = logits.argmax(dim=-1)
        else:
            # an ahead step samples each sequence's next position: the token before it is not on the host yet
            sb = SamplingBatch.for_seqs(
                seqs, logits.shape[-1], self.device, batch.ahead, history=self.history, eos_token_ids=self.eos_token_ids
            )
            if mask is not None:
                sb.grammar = self.grammar.finish(mask)
            ids = self.sampler(logits, sb)
        if (plan := sampled_plan(seqs)) is not None:  # the raw logprobs of the chosen tokens, rows that ask only
            rows, owners, ks = plan
            lp = lp or StepLogprobs()
            # from fp32 logits of the rows that ask (Model.compute_logits_fp32: the sampler's model-dtype logits
            # are rounded too coarsely for a log-likelihood), in chunks of rows
            if len(rows) == len(seqs):  # every row asks: no gather
                h, chosen, hs = hidden, ids, row_slots
            else:
                at = torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)
                h, chosen = hidden.index_select(0, at), ids[at]
                hs = row_slots[rows] if row_slots is not None else None
            lm_head = self.model.compute_logits_fp32
            lp.sampled = logprob_rows(
                lambda lo, hi: lm_head(h[lo:hi], None if hs is None else hs[lo:hi]),
                h.shape[0],
                logits.shape[-1],
                chosen,
                max(ks),
            )
            lp.sampled_owners, lp.sampled_ks = owners, ks
        if self.device.type != "cuda":
            return Launched(batch, ids, ids, None, t0, graph, lp)
        # the ids come back through page-locked memory, two buffers taking turns (at most two steps in flight)
        self._turn ^= 1
        host = self._host_ids[self._turn][: ids.shape[0]]
        host.copy_(ids, non_blocking=True)
        return self._done(Launched(batch, ids, host, None, t0, graph, lp))

    def _done(self, launched: Launched) -> Launched:
        """Queue the logprobs' copies to the host and, on CUDA, record the event `collect` waits for."""
        if launched.logprobs is not None:
            launched.logprobs.to_host()
        if self.device.type == "cuda" and (launched.host is not None or launched.logprobs is not None):
            launched.done = torch.cuda.Event()
            launched.done.record()
        return launched

    def _prompt_logprobs(self, hidden: torch.Tensor, prows: PromptRows) -> torch.Tensor:
        """hidden: [T, H] of the step -> [R, 2 + 2k] for its prompt rows (engine/logprobs.py)."""
        n = len(prows.rows)
        both = torch.tensor(prows.rows + prows.targets, dtype=torch.long).to(self.device, non_blocking=True)
        if self.vocab is None or not self.vocab.adapts_head:
            return prompt_logprobs(
                self.model.compute_logits_fp32, hidden, both[:n], both[n:], max(prows.ks), self.vocab_size
            )
        slots = np.asarray([s.slot for s in prows.owners])  # each prompt row's adapter: lm_head adapters
        rows, lm_head = both[:n], self.model.compute_logits_fp32
        return logprob_rows(
            lambda lo, hi: lm_head(hidden[rows[lo:hi]], slots[lo:hi]), n, self.vocab_size, both[n:], max(prows.ks)
        )

    def _forward_eager(self, batch: ScheduledBatch, rope_long: np.ndarray | None = None, feed=None):
        """One eager forward of `batch`: (hidden [T, H], its StepInputs). `rope_long`: LongRoPE's per-token
        choice (engine/long_rope.py); `feed`: an ahead batch's ids on the device."""
        lora = None
        if self.max_loras > 0 and any(s >= 0 for s in batch.slots):
            token_slots = batch.token_lora_slots()
            lora = (
                self._meta_buffers.build(token_slots)
                if self._meta_buffers is not None
                else build_lora_meta(token_slots, self.device)
            )
            if self.graphs is not None:
                self.graphs.lora_key = None  # the shared LoRA buffers no longer hold the graphs' metadata
        inputs = build_step_inputs(batch, self.device, lora)
        if feed is not None:
            inputs.input_ids.copy_(feed)  # [B]: one token per sequence, in the order the ids were sampled
        if rope_long is not None:
            inputs.ctx.rope_long = torch.from_numpy(rope_long).to(self.device, non_blocking=True)
        set_context(inputs.ctx)
        try:
            return self.model(inputs.input_ids, inputs.positions), inputs  # hidden: [T, H]
        finally:
            reset_context()

    @staticmethod
    def _read_ids(launched: Launched) -> list[int]:
        """A launched step's sampled ids, once they reached the host."""
        if launched.done is not None:
            launched.done.synchronize()
        return launched.host.tolist() if launched.host is not None else []

    def collect(self, launched: Launched) -> list[int]:
        """Wait for a launched step; its sampled ids (one per `batch.sampled_seqs()`), its logprobs attached to
        their sequences (not in `_read_ids`: the grammar's worker reads the previous step's ids through it)."""
        out = self._read_ids(launched)
        if launched.logprobs is not None:
            launched.logprobs.attach()
        self._log(launched)
        return out

    def _log(self, launched: Launched) -> None:
        """A step's wall time runs from its launch (or the end of the step before it, when it was launched
        while that one ran) to its ids being read back: the steps' times add up to wall time, not more."""
        now = time.perf_counter()
        since, self._last_done = max(launched.t0, self._last_done), now
        if self.first_done is None:
            self.first_done = now
        if self.step_log is None:
            return
        batch = launched.batch
        self.step_log.append(
            StepRecord(
                decode=batch.is_decode_only,
                graph=launched.graph,
                seqs=batch.num_seqs,
                tokens=batch.num_tokens,
                kv_tokens=sum(batch.seq_lens()),
                adapters=len({s for s in batch.slots if s >= 0}),
                seconds=now - since,
            )
        )
