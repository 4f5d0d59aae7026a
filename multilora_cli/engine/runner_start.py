"""The runner's kernels before its first step: the decode CUDA graphs (built, and captured now unless lazy), the
parallel precompile of every Triton kernel the run will launch (engine/precompile.py), and the count of Triton's
compiles vs cache loads while the runner starts and after (kernels/compile_log.py; the stats' "startup")."""

from __future__ import annotations

import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.cuda_graphs import DecodeGraphs
from multilora_cli.engine.precompile import precompile
from multilora_cli.engine.runner_sizing import precompile_tokens
from multilora_cli.kernels import LoraMetaBuffers
from multilora_cli.kernels.compile_log import compile_log


class TritonStartLog:
    """Snapshots of Triton's compile log when the runner starts (`__init__`) and when its kernels are ready
    (`ready`); nothing on CPU."""

    def __init__(self, device: torch.device):
        self._log = compile_log() if device.type == "cuda" else None
        self._start = self._log.snapshot() if self._log is not None else None
        self._ready = None

    def ready(self) -> None:
        self._ready = self._log.snapshot() if self._log is not None else None

    def counts(self) -> dict:
        """Triton compiles and cache loads while the runner started (model load, precompile, eager capture:
        "triton_at_start") and since ("triton_in_steps": lazy captures, step sizes no dry run met); {} on CPU or
        with a Triton without the listener."""
        log = self._log
        if log is None or not log.supported:
            return {}
        return {
            "triton_at_start": log.since(self._start, self._ready),
            "triton_in_steps": log.since(self._ready),
        }


def compile_and_capture(
    model,
    config: EngineConfig,
    meta_buffers: LoraMetaBuffers | None,
    *,
    max_model_len: int,
    device: torch.device,
    slot_writer=None,
) -> tuple[DecodeGraphs | None, int, float]:
    """(decode graphs or None, kernels precompiled, seconds of the precompile) for `model` with its KV cache
    allocated. Graphs on CUDA unless config.enforce_eager. `slot_writer`: the runner's SlotWriter (its load's
    launch is precompiled too), None without LoRA."""
    graphs: DecodeGraphs | None = None
    # MoE experts on CUDA run kernels/fused_moe.py: static shapes given T, no host sync, so they are captured too
    if device.type == "cuda" and not config.enforce_eager:
        graphs = DecodeGraphs(
            model,
            max_num_seqs=min(config.max_num_seqs, config.max_decode_batch or config.max_num_seqs),
            max_model_len=max_model_len,
            block_size=config.block_size,
            lora_buffers=meta_buffers,
            device=device,
            lazy=config.lazy_capture,
        )
    # every Triton kernel the run will launch, compiled in parallel now (a cold cache compiled them one by
    # one inside the graph warm-ups and the first prefill steps); the compile log tells compiles from loads
    precompiled, seconds = precompile(
        model,
        graphs,
        meta_buffers,
        max_num_batched_tokens=precompile_tokens(config),
        max_model_len=max_model_len,
        block_size=config.block_size,
        device=device,
        line_kinds=config.line_kinds,
        slot_writer=slot_writer,
    )
    if graphs is not None and not graphs.lazy:
        graphs.capture()
    return graphs, precompiled, seconds
