"""`ModelRunner`: owns the model, its KV cache and LoRA slots on one device; runs one scheduled step.

Per step it builds the metadata ONCE (token ids, positions, KV slots, attention context, LoRA segments), runs
the model over the flat token batch, takes the logits of the sequences that sample, and samples. On CUDA,
decode-only steps replay CUDA graphs captured at bucketed batch sizes (engine/cuda_graphs.py); prefill and
mixed steps run eagerly from one packed host->device copy (engine/step_inputs.py). Parts: engine/device_adapters,
runner_sizing, runner_start (graphs, precompile), step_logits (logprobs), step_record.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.device import pick_device
from multilora_cli.engine.device_adapters import DeviceAdapters
from multilora_cli.engine.logits_processing import TokenHistory
from multilora_cli.engine.logprobs import CHUNK_ELEMS, PromptRows, StepLogprobs, sampled_plan
from multilora_cli.engine.long_rope import crossings, long_mask, recompute_batches
from multilora_cli.engine.runner_sizing import kv_cache_blocks, window_kv_blocks
from multilora_cli.engine.runner_start import TritonStartLog, compile_and_capture
from multilora_cli.engine.sampler import Sampler, SamplingBatch
from multilora_cli.engine.step_inputs import build_step_inputs
from multilora_cli.engine.step_logits import (
    add_sampled_logprobs,
    all_greedy,
    sampled_logprobs_of,
    step_prompt_logprobs,
)
from multilora_cli.engine.step_record import Launched, StepRecord
from multilora_cli.errors import EngineError
from multilora_cli.kernels import LoraMetaBuffers, build_lora_meta, driver_warm
from multilora_cli.layers.context import reset_context, set_context
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.head_check import head_gemms
from multilora_cli.models.loader import load_model, resolve_dtype
from multilora_cli.models.quantization import ONLINE


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
        self._triton = TritonStartLog(self.device)  # Triton's compiles vs cache loads from here on
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
        # every kind of adapter slot (dense, DoRA rows, embed_tokens / lm_head, MoE experts), before the KV cache
        # is sized (so it counts them) and before graph capture
        use_vocab = vocab if use_lora else None
        self.adapters = DeviceAdapters(
            self.model, model_config, self.device, self.dtype, dora=dora and use_lora, vocab=use_vocab
        )
        self.vocab = self.adapters.vocab  # layers/vocab_lora.py slots, None: the run has no such adapter
        self.block_size = config.block_size
        per_block = self.model.kv_bytes_per_block(self.block_size)
        self.num_blocks = kv_cache_blocks(config, model_config, per_block, self.device, self.dtype)
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
        self.token_texts = None  # token ids -> their texts (logprob entries); set by the engine
        self.step_log: list[StepRecord] | None = None  # set to [] to record every step (benchmarks)
        self._last_done = 0.0  # when the last step's ids were read (step times, `_log`)
        self.installs = 0  # slot loads made (`install_adapter`); `_log` records those since the step before
        self._logged_installs = 0
        self.first_done: float | None = None  # when the first step's ids were read (perf_counter; startup stats)
        self._turn = 0
        self._host_ids = (
            [torch.empty(config.max_num_seqs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            if self.device.type == "cuda"
            else []
        )
        self.graphs, self.precompiled, self.precompile_seconds = compile_and_capture(
            self.model,
            config,
            self._meta_buffers,
            max_model_len=self.max_model_len,
            device=self.device,
            slot_writer=self.adapters.writer if self.max_loras else None,
        )
        self._triton.ready()
        # where one LM-head GEMM serves the sampler and the logprobs (models/head_check.py): row counts up to the
        # most sequences a step can sample (the input's bound when known: a 14-line job checks 14) whose fp32
        # logits fit one chunk (the memory the two-GEMM path's fp32 logits take); a larger step takes two GEMMs
        rows = min(config.max_num_seqs, config.max_decode_batch or config.max_num_seqs, CHUNK_ELEMS // self.vocab_size)
        self.head_gemms = head_gemms(self.model, rows)

    def triton_counts(self) -> dict:
        """Triton compiles and cache loads while the runner started and since (engine/runner_start.py)."""
        return self._triton.counts()

    @property
    def capture_seconds(self) -> float:
        """Seconds spent capturing decode graphs so far (at start; inside the steps with lazy capture)."""
        return self.graphs.capture_seconds if self.graphs is not None else 0.0

    @property
    def max_model_len(self) -> int:
        limit = self.config.max_model_len or self.model_config.max_position_embeddings
        held = window_kv_blocks(self.config, self.model_config)
        if held is not None and held <= self.num_blocks:
            return limit  # every layer slides: a sequence of any length holds its window's blocks only
        return min(limit, self.num_blocks * self.block_size)

    # --- LoRA slots (engine/device_adapters.py) ----------------------------------------------------------------
    def install_adapter(self, slot: int, name: str, adapter) -> None:
        """Copy a loaded adapter (adapters.peft.LoraAdapter) into `slot` of every LoRA layer."""
        self.adapters.install(slot, name, adapter)
        self.installs += 1

    def evict_adapter(self, slot: int, name: str) -> None:
        self.adapters.clear(slot)

    def stage_adapter(self, adapter) -> bool:
        """Copy a packed adapter to the device ahead of its slot load (`DeviceAdapters.stage`)."""
        return self.adapters.stage(adapter)

    @property
    def staging_buffers(self) -> int:
        return self.adapters.staging_buffers

    def staging_stats(self) -> dict:
        return self.adapters.staging_stats()

    def load_stalls(self) -> tuple[int, float]:
        """(steps, GPU seconds) that steps waited for their slots' loads (engine/slot_writer.py `wait_for`)."""
        return self.adapters.load_stalls() if self.max_loras else (0, 0.0)

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
        if self.max_loras:
            self.adapters.wait_for(batch.slots, timed=True)  # loads into this step's slots land first; others run on
        start = None
        if self.step_log is not None and self.device.type == "cuda":  # benchmarks: the step's device time
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        feed = None
        if batch.ahead:
            if prev is None or prev.ids is None or prev.ids.shape[0] != batch.num_seqs:
                raise EngineError("internal: an ahead step needs the ids of the step before it")
            feed = prev.ids
        # the constrained rows' mask, computed on a worker thread while the forward is queued (engine/grammar/)
        mask = None
        if self.grammar is not None:
            if self.graphs is not None and self.graphs.can_run(batch):
                # a lazy capture first, before the worker starts waiting on the previous step's event (captures
                # run in thread_local mode, engine/cuda_graphs.py, but the worker's wait gains nothing by overlapping)
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
                head = self.vocab is not None and self.vocab.adapts_head
                prompt = step_prompt_logprobs(
                    self.model.compute_logits_fp32, hidden, prows, head, self.vocab_size, self.device
                )
                lp = StepLogprobs(prompt=prompt, prompt_rows=prows)
            if inputs.num_logits == 0:
                return self._done(Launched(batch, None, None, None, t0, graph, lp), start)  # (no mask was begun)
            hidden = hidden.index_select(0, inputs.logits_rows)
        seqs = batch.sampled_seqs()
        if not seqs:
            return self._done(Launched(batch, None, None, None, t0, graph, lp), start)
        # each row's slot, for lm_head adapters (layers/vocab_lora.py); None: the head is the base's for every row
        row_slots = np.asarray([s.slot for s in seqs]) if self.vocab is not None and self.vocab.adapts_head else None
        plan = sampled_plan(seqs)  # the rows asking for logprobs, None: none
        asking = None  # [R, V] fp32 logits of the asking rows, when one GEMM made both
        if plan is not None and self.head_gemms.one_gemm(len(seqs)):
            rows = None if len(plan[0]) == len(seqs) else plan[0]
            logits, asking = self.model.compute_logits_pair(hidden, rows, row_slots)
        else:
            logits = self.model.compute_logits(hidden, upcast=False, slots=row_slots)  # [N, V] model dtype
        if mask is None and all_greedy(seqs):
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
        if plan is not None:  # the raw logprobs of the chosen tokens, rows that ask only
            lp = lp or StepLogprobs()
            if asking is not None:
                sampled_logprobs_of(lp, plan, asking, ids, self.device)
            else:  # a second LM-head GEMM, fp32 output, for the asking rows
                lm_head = self.model.compute_logits_fp32
                add_sampled_logprobs(lp, plan, lm_head, hidden, ids, row_slots, logits.shape[-1], self.device)
        if self.device.type != "cuda":
            launched = Launched(batch, ids, ids, None, t0, graph, lp)
            launched.queued = time.perf_counter()
            return launched
        # the ids come back through page-locked memory, two buffers taking turns (at most two steps in flight)
        self._turn ^= 1
        host = self._host_ids[self._turn][: ids.shape[0]]
        host.copy_(ids, non_blocking=True)
        return self._done(Launched(batch, ids, host, None, t0, graph, lp), start)

    def _done(self, launched: Launched, start: torch.cuda.Event | None) -> Launched:
        """Queue the logprobs' copies to the host and, on CUDA, record the event `collect` waits for (and, with a
        step log, the timing event after the step's work, `start` the one before it)."""
        if start is not None:  # (before the copies: the step's own work)
            launched.start, launched.end = start, torch.cuda.Event(enable_timing=True)
            launched.end.record()
        if launched.logprobs is not None:
            launched.logprobs.to_host()
        if self.device.type == "cuda" and (launched.host is not None or launched.logprobs is not None):
            launched.done = torch.cuda.Event()
            launched.done.record()
        launched.queued = time.perf_counter()
        return launched

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
            launched.logprobs.attach(out, self.token_texts)
        self._log(launched)
        return out

    def _log(self, launched: Launched) -> None:
        """A step's wall time runs from its launch (or the end of the step before it, when it was launched
        while that one ran) to its ids being read back: the steps' times add up to wall time, not more."""
        now = time.perf_counter()
        since, self._last_done = max(launched.t0, self._last_done), now
        loads, self._logged_installs = self.installs - self._logged_installs, self.installs
        if self.first_done is None:
            self.first_done = now
        if self.step_log is None:
            return
        batch = launched.batch
        gpu = None
        if launched.start is not None:
            launched.end.synchronize()  # (done when the ids were read, unless the step sampled none)
            gpu = launched.start.elapsed_time(launched.end) / 1e3
        self.step_log.append(
            StepRecord(
                decode=batch.is_decode_only,
                graph=launched.graph,
                seqs=batch.num_seqs,
                tokens=batch.num_tokens,
                kv_tokens=sum(batch.seq_lens()),
                adapters=len({s for s in batch.slots if s >= 0}),
                seconds=now - since,
                enqueue_seconds=launched.queued - launched.t0,
                gpu_seconds=gpu,
                loads=loads,
            )
        )
