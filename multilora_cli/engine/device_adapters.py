"""`DeviceAdapters`: the runner's adapter slots of every kind on one device, loaded and cleared together.

    dense LoRA layers: SlotWriter (engine/slot_writer.py; DoRA scale rows when the run has a DoRA adapter, and
                       on CUDA its device staging buffers for slot loads made ahead);
    embed_tokens / lm_head: the model's vocab slots (layers/vocab_lora.py), None when no adapter has them;
    MoE experts: each sparse layer's expert LoRA slots (engine/expert_slots.py), written by the same SlotWriter
                       load (packed: in its scatter's launches).

All of them exist before the KV cache is sized (so it counts their bytes) and before graph capture.
"""

from __future__ import annotations

import torch

from multilora_cli.engine.expert_slots import ExpertSlots
from multilora_cli.engine.runner_sizing import staging_buffers
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.engine.staging import DeviceStager
from multilora_cli.errors import EngineError
from multilora_cli.models.config import ModelConfig


class DeviceAdapters:
    """`dora`: some adapter of the run is DoRA; `vocab`: the vocab slots' sizes (Model.enable_vocab's keywords:
    embed_lora, head_lora, embed_full, head_full), None or empty without them."""

    def __init__(
        self, model, model_config: ModelConfig, device: torch.device, dtype: torch.dtype, *, dora: bool, vocab
    ):
        self.device = device
        self.lora_modules = model.lora_modules()
        self.expert_modules = model.expert_lora_modules()  # MoE: {layer: MoeExperts} with LoRA slots
        experts = ExpertSlots({layer: m.lora for layer, m in self.expert_modules.items()}, device)
        self.writer = SlotWriter(self.lora_modules, device, experts)
        if dora:  # scale rows in every module, before graph capture
            self.writer.enable_dora()
        self.vocab = _enable_vocab(model, vocab, model_config, dtype) if vocab else None
        if device.type == "cuda" and self.lora_modules:
            # one slot's worth each (with DoRA: and the magnitudes packed behind A / B)
            numel = self.writer.staged_numel
            self.writer.stager = DeviceStager(device, numel, dtype, n_buffers=staging_buffers(numel * dtype.itemsize))

    def install(self, slot: int, name: str, adapter) -> None:
        """Copy a loaded adapter (adapters.peft.LoraAdapter) into `slot` of every LoRA layer."""
        self.writer.install(slot, adapter)
        vocab = getattr(adapter, "vocab", None)
        if self.vocab is not None:
            self.vocab.install(slot, vocab)
        elif vocab is not None:
            raise EngineError(
                f"internal: adapter {name!r} adapts embed_tokens / lm_head but the engine has no slots for them",
                hint="this is a bug: the engine sizes those slots from the run's adapters",
            )

    def wait_for(self, slots, timed: bool = False) -> None:
        """The compute stream waits for the loads still pending into `slots` (engine/slot_writer.py)."""
        if self.writer.stream is not None:
            self.writer.wait_for(slots, timed)

    def load_stalls(self) -> tuple[int, float]:
        """(steps that waited for a load still copying, GPU seconds they waited): 0 without a load stream."""
        if self.writer.stream is None:
            return 0, 0.0
        return self.writer.stalled_steps, self.writer.stall_seconds()

    def clear(self, slot: int) -> None:
        self.writer.clear(slot)
        if self.vocab is not None:
            self.vocab.clear(slot)

    def stage(self, adapter) -> bool:
        """Copy a packed adapter to the device ahead of its slot load (thread-safe; the prefetch thread calls
        this). False where there is nothing to gain: on CPU, or no buffer to spare."""
        stager = self.writer.stager
        return stager is not None and getattr(adapter, "flat", None) is not None and stager.stage(adapter)

    @property
    def staging_buffers(self) -> int:
        """Device staging buffers (0 without: CPU, or no LoRA)."""
        stager = self.writer.stager
        return len(stager.buffers) if stager is not None else 0

    def staging_stats(self) -> dict:
        """Counters of the device staging buffers: staged, taken (slot loads that skipped the host copy),
        reclaimed, skipped; {} without them."""
        stager = self.writer.stager
        return stager.stats() if stager is not None else {}


def _enable_vocab(model, parts: dict, cfg: ModelConfig, dtype: torch.dtype):
    try:
        return model.enable_vocab(**parts)
    except torch.OutOfMemoryError:
        full = parts.get("embed_full", 0) + parts.get("head_full", 0)
        each = cfg.vocab_size * cfg.hidden_size * dtype.itemsize
        raise EngineError(
            f"no GPU memory for the adapters' embed_tokens / lm_head slots ({full} full-weight copies of "
            f"{each / 2**20:.0f} MiB each for modules_to_save, plus vocabulary-sized LoRA slots)",
            hint="lower --max-loras (the copies are one per slot, up to the adapters that have them)",
        ) from None


def lora_targets(adapters, scans: dict, model_config: ModelConfig) -> set[str] | None:
    """The fused modules (models/config.FUSED_MODULES) some adapter of the run adapts, from pre-flight's scans
    (`scans`: name -> adapters.scan.AdapterScan of every adapter in `adapters`); None (every module) when an
    adapter has no scan, the base is MoE, or a module is not a dense projection. Modules no adapter adapts get no
    LoRA layer: no slots, no SGMV launch in any step, no kernel variant to compile (the demo's adapters adapt
    q, k, v and o: its MLPs run as the base's). An adapter adapting another module is refused at its slot load
    (SlotWriter), never served without it."""
    from multilora_cli.models.config import FUSED

    if model_config.moe is not None or any(name not in scans for name in adapters):
        return None
    targets = set()
    for name in adapters:
        for _, module in scans[name].modules:
            if module not in FUSED:
                return None
            targets.add(FUSED[module][0])
    return targets or None
