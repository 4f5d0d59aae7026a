"""Synthetic LoRA adapters held in host memory, and an Engine that reads them instead of disk.

Each adapter has rank `rank` on all seven projections of every layer (PEFT layout: A [r, in], B [out, r]),
random values, alpha = 2r. At most `max_distinct` distinct weight sets are generated (each ~84 MB at
Llama-3-8B shapes, rank 16); adapters beyond that reuse one round-robin with their own scaling. The GPU work
is the same either way: every adapter is copied into its own slot and read from there.
`SyntheticEngine._load_cpu` packs each adapter into one host buffer exactly as `Engine._load_cpu` packs a
PEFT checkpoint after reading it (engine/packed.py), so the benchmark times the slot-load path real adapters
take; only the disk read and validation of `load_adapter` are left out.
"""

from __future__ import annotations

from pathlib import Path

import torch

from multilora_cli.adapters.peft import LoraAdapter, LoraModule
from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from multilora_cli.models.config import LINEAR_MODULES, ModelConfig


class SyntheticAdapters:
    """names -> LoraAdapter, generated up front by `prepare` (outside any timed region)."""

    def __init__(self, model_config: ModelConfig, names: list[str], rank: int, *, seed: int = 0,
                 max_distinct: int = 64):
        self.model_config = model_config
        self.names = list(names)
        self.rank = rank
        self.seed = seed
        self.max_distinct = max(1, max_distinct)
        self._banks: list[dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]] = []
        self._cache: dict[str, LoraAdapter] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of one adapter's A and B tensors at 2 bytes per value (what a slot load moves)."""
        cfg = self.model_config
        per_layer = sum(self.rank * sum(cfg.linear_shape(m)) for m in LINEAR_MODULES)
        return 2 * per_layer * cfg.num_hidden_layers

    def prepare(self, dtype: torch.dtype, device: torch.device) -> None:
        """Draw the distinct weight sets on `device` (fast), keep them in ordinary (pageable) host memory, like
        the tensors `load_adapter` returns: one flat buffer per set, viewed as each module's A [r, in], B [out, r]."""
        cfg = self.model_config
        layout, total = [], 0
        for layer in range(cfg.num_hidden_layers):
            for m in LINEAR_MODULES:
                fin, fout = cfg.linear_shape(m)
                layout.append(((layer, m), total, fin, fout))
                total += self.rank * (fin + fout)
        gen = torch.Generator(device=device).manual_seed(self.seed)
        r = self.rank
        for _ in range(min(len(self.names), self.max_distinct)):
            dev = torch.randn(total, generator=gen, device=device, dtype=torch.float32)
            for _, off, fin, fout in layout:  # A ~ N(0, 1/in) keeps x @ A.T ~ O(1); B small
                dev[off:off + r * fin].mul_(fin ** -0.5)
                dev[off + r * fin:off + r * (fin + fout)].mul_(0.05)
            dev = dev.to(dtype)
            host = dev.cpu()
            self._banks.append({key: (host[off:off + r * fin].view(r, fin),
                                      host[off + r * fin:off + r * (fin + fout)].view(fout, r))
                                for key, off, fin, fout in layout})

    def load(self, name: str) -> LoraAdapter:
        """The adapter `name` (thread-safe: only reads prepared tensors)."""
        if name in self._cache:
            return self._cache[name]
        if not self._banks:
            raise RuntimeError("SyntheticAdapters.prepare() was not called")
        i = self.names.index(name)
        bank = self._banks[i % len(self._banks)]
        scaling = 2.0 * (1.0 + 0.01 * (i // len(self._banks)))  # alpha / r = 2, nudged for shared banks
        modules = {key: LoraModule(a=a, b=b, scaling=scaling) for key, (a, b) in bank.items()}
        adapter = LoraAdapter(name=name, path=Path("synthetic") / name, config=None, modules=modules,
                              base_model=None, weights_path=Path("synthetic") / name,
                              stored_dtype=next(iter(bank.values()))[0].dtype, stored_nbytes=self.nbytes)
        self._cache[name] = adapter
        return adapter


class SyntheticEngine(Engine):
    """An `Engine` whose adapters come from a `SyntheticAdapters` source instead of PEFT folders."""

    def __init__(self, config: EngineConfig, source: SyntheticAdapters | None,
                 model_config: ModelConfig | None = None):
        self.source = source
        names = source.names if source is not None else []
        super().__init__(config, {n: Path("synthetic") / n for n in names}, model_config)

    def _load_cpu(self, name: str) -> LoraAdapter:
        """As Engine._load_cpu after its disk read: packed exactly as real adapters are."""
        return self._pack(self.source.load(name))

    def _adapter_nbytes(self, name: str) -> int:
        return self.source.nbytes * self.runner.dtype.itemsize // 2
