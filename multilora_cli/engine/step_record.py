"""What the model runner keeps of a step: `Launched` (a step queued on the device, until its ids are read back)
and `StepRecord` (its shape and wall time, for benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.logprobs import StepLogprobs


@dataclass(slots=True)
class StepRecord:
    """One step as the runner saw it (kept only when `ModelRunner.step_log` is a list: benchmarks).

    seconds: host wall time of the step (metadata build, forward, LM head, sampling, reading the ids back; a
             step launched while the one before it ran counts from that one's end, see `ModelRunner._log`);
    kv_tokens: context tokens of all sequences after the step (what decode attention reads);
    adapters: distinct LoRA slots in the step;
    enqueue_seconds: host time from the step's launch until all its work was queued (eager steps: Python and
             launches; long when the step loop's thread is held up, e.g. by the GIL);
    gpu_seconds: CUDA only: device time from the step's first queued work (after any wait for its slots' loads)
             to its last, idle gaps included (None elsewhere). A step whose gpu_seconds is near its
             enqueue_seconds was fed by the host no faster than it ran;
    loads: slot loads made since the step before was logged: beside this step on the load stream (preloads) or
             before it (its admissions' loads)."""

    decode: bool
    graph: bool
    seqs: int
    tokens: int
    kv_tokens: int
    adapters: int
    seconds: float
    enqueue_seconds: float = 0.0
    gpu_seconds: float | None = None
    loads: int = 0


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
    # benchmarks (a step log kept): when the step was all queued (perf_counter), timing events around its work
    queued: float = 0.0
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
