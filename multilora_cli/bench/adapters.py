"""Synthetic LoRA adapters written as real PEFT checkpoints, and an Engine that serves them.

Each adapter has rank `rank` on every linear module of every layer (the seven projections; Phi-3's four, with
its fused qkv_proj / gate_up_proj) (PEFT layout: A [r, in], B [out, r]); on a MoE base, on attention and on the
experts of each sparse layer (PEFT target_parameters on mlp.experts.gate_up_proj / down_proj: E x rank each),
random values, alpha = 2r. At most `max_distinct` distinct weight sets are generated (each ~84 MB at
Llama-3-8B shapes, rank 16); adapters beyond that reuse one round-robin with their own scaling. The GPU work
is the same either way: every adapter is copied into its own slot and read from there. With `dora`, every module
also gets a DoRA magnitude vector m [out] (uniform in [0.5, 1.5] times 0.02 sqrt(in), the norm of a row of the
dummy weights, N(0, 0.02^2)) and the configs say use_dora: the engine then computes m / ||W + s·B·A|| at each slot load.

`prepare` writes each weight set once as an `adapter_model.safetensors` (PEFT's key names, the run dtype) and
each adapter as a folder of its own: that file (hard-linked) and an `adapter_config.json` with its alpha. So the
engine reads and validates them exactly as it reads a user's adapters (`Engine._load_cpu`), from the OS page
cache: a benchmark row times the whole read path except the disk itself. An adapter without a folder (`prepare`
not called) is packed from the tensors in memory instead, without the read and the validation.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from multilora_cli.adapters.peft import LoraAdapter, LoraModule
from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from multilora_cli.models.config import ATTN_MODULES, CHECKPOINT_FUSED, ModelConfig

_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")
_NEST = {"experts.gate_up_proj": ".base_layer", "experts.down_proj": ""}  # PEFT: the later target wraps the earlier
_FILES: dict[tuple, Path] = {}  # (shapes, rank, seed, dtype, weight set) -> safetensors file, per process
_ROOT: list[Path] = []


class SyntheticAdapters:
    """names -> LoraAdapter, generated up front by `prepare` (outside any timed region)."""

    def __init__(
        self,
        model_config: ModelConfig,
        names: list[str],
        rank: int,
        *,
        seed: int = 0,
        max_distinct: int = 64,
        dora: bool = False,
    ):
        self.model_config = model_config
        self.names = list(names)
        self.rank = rank
        self.seed = seed
        self.max_distinct = max(1, max_distinct)
        self.dora = dora
        self._magnitudes: list[dict[tuple[int, str], torch.Tensor]] = []  # per weight set, DoRA only
        self._banks: list[dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]] = []
        self._cache: dict[str, LoraAdapter] = {}
        self._index = {n: i for i, n in enumerate(self.names)}  # names.index per load was O(adapters)
        self.paths: dict[str, Path] = {}  # name -> PEFT folder, once `prepare` wrote them

    @property
    def nbytes(self) -> int:
        """Bytes of one adapter's A and B tensors at 2 bytes per value (what a slot load moves)."""
        return 2 * sum(ra * fin + fout * rb for _, fin, fout, ra, rb in self._layout())

    @property
    def expert_nbytes(self) -> int:
        """The part of `nbytes` that is expert LoRA (MoE bases; 0 on a dense one)."""
        return 2 * sum(ra * fin + fout * rb for (_, m), fin, fout, ra, rb in self._layout() if m.startswith("experts."))

    def _layout(self) -> list[tuple[tuple[int, str], int, int, int, int]]:
        """[((layer, module), in, out, rows of A, columns of B)]: A [ra, in], B [out, rb]. A linear module has
        ra = rb = rank; on a MoE base, a sparse layer has no dense MLP module but its experts' 3D parameters
        (PEFT target_parameters: "experts.gate_up_proj" / "experts.down_proj", A [E * r, in], B [out, r * E])."""
        cfg, r = self.model_config, self.rank
        out = []
        for layer in range(cfg.num_hidden_layers):
            sparse = cfg.is_sparse_layer(layer)
            for m in cfg.peft_modules:
                if sparse and m in _DENSE_MLP:
                    continue
                fin, fout = cfg.linear_shape(m)
                out.append(((layer, m), fin, fout, r, r))
            if sparse:
                E, h, inter = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.intermediate_size
                out.append(((layer, "experts.gate_up_proj"), h, 2 * inter, E * r, E * r))
                out.append(((layer, "experts.down_proj"), inter, h, E * r, E * r))
        return out

    def prepare(self, dtype: torch.dtype, device: torch.device, *, write: bool = True) -> None:
        """Draw the distinct weight sets on `device` (fast), keep them in ordinary (pageable) host memory, like
        the tensors `load_adapter` returns: one flat buffer per set, viewed as each module's A [r, in], B [out, r];
        with `write`, also as PEFT checkpoint folders (`paths`)."""
        self._draw(dtype, device)
        if write:
            self.paths = self._write(dtype)

    def _draw(self, dtype: torch.dtype, device: torch.device) -> None:
        layout, total = [], 0
        for key, fin, fout, ra, rb in self._layout():
            layout.append((key, total, fin, fout, ra, rb))
            total += ra * fin + fout * rb
        gen = torch.Generator(device=device).manual_seed(self.seed)
        for _ in range(min(len(self.names), self.max_distinct)):
            dev = torch.randn(total, generator=gen, device=device, dtype=torch.float32)
            for _, off, fin, fout, ra, rb in layout:  # A ~ N(0, 1/in) keeps x @ A.T ~ O(1); B small
                dev[off : off + ra * fin].mul_(fin**-0.5)
                dev[off + ra * fin : off + ra * fin + fout * rb].mul_(0.05)
            dev = dev.to(dtype)
            host = dev.cpu()
            if self.dora:
                self._magnitudes.append(
                    {
                        key: (torch.rand(fout, generator=gen, device=device) + 0.5).mul_(0.02 * fin**0.5).cpu()
                        for key, _, fin, fout, _, _ in layout
                        if not key[1].startswith("experts.")
                    }
                )
            self._banks.append(
                {
                    key: (
                        host[off : off + ra * fin].view(ra, fin),
                        host[off + ra * fin : off + ra * fin + fout * rb].view(fout, rb),
                    )
                    for key, off, fin, fout, ra, rb in layout
                }
            )

    def _write(self, dtype: torch.dtype) -> dict[str, Path]:
        cfg, r = self.model_config, self.rank
        if not _ROOT:
            _ROOT.append(Path(tempfile.mkdtemp(prefix="multilora-bench-adapters-")))
            atexit.register(shutil.rmtree, _ROOT[0], True)
        root = _ROOT[0]
        sig = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.peft_modules,  # the files' key names: Phi-3's fused modules or the seven projections
            (cfg.moe.num_experts, cfg.moe.intermediate_size, cfg.moe.sparse_layers) if cfg.moe is not None else None,
            r,
            self.seed,
            str(dtype),
            self.dora,
        )
        files = []
        for i, bank in enumerate(self._banks):
            f = _FILES.get((*sig, i))
            if f is None:
                from safetensors.torch import save_file

                f = root / f"set{len(_FILES)}.safetensors"
                tensors = {}
                for (layer, m), (a, b) in bank.items():
                    parent = "self_attn" if m in ATTN_MODULES or m == "qkv_proj" else "mlp"
                    key = f"base_model.model.model.layers.{layer}.{parent}.{m}"
                    if m.startswith("experts."):  # PEFT's ParamWrapper keys: the second parameter nests the first
                        key = f"base_model.model.model.layers.{layer}.mlp.experts" + _NEST[m]
                    tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a.clone(), b.clone()
                    if self.dora and (layer, m) in self._magnitudes[i]:
                        tensors[f"{key}.lora_magnitude_vector"] = self._magnitudes[i][(layer, m)].to(dtype)
                save_file(tensors, str(f))
                _FILES[(*sig, i)] = f
            files.append(f)
        paths = {}
        targets = sorted({m for _, m in self._banks[0] if not m.startswith("experts.")})
        for i, name in enumerate(self.names):
            d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
            try:
                os.link(files[i % len(files)], d / "adapter_model.safetensors")
            except OSError:  # no hard links here: a copy
                shutil.copyfile(files[i % len(files)], d / "adapter_model.safetensors")
            (d / "adapter_config.json").write_text(
                json.dumps(
                    {
                        "peft_type": "LORA",
                        "task_type": "CAUSAL_LM",
                        "r": r,
                        "lora_alpha": self._scaling(i) * r,
                        "target_modules": targets,
                        **({"target_parameters": [f"mlp.{p}" for p in _NEST]} if cfg.moe is not None else {}),
                        "lora_dropout": 0.0,
                        "bias": "none",
                        "use_dora": self.dora,
                        "base_model_name_or_path": cfg.name_or_path or None,
                    }
                )
            )
            paths[name] = d
        return paths

    def _scaling(self, i: int) -> float:
        return 2.0 * (1.0 + 0.01 * (i // len(self._banks)))  # alpha / r = 2, nudged for shared sets

    def load(self, name: str) -> LoraAdapter:
        """The adapter `name` (thread-safe: only reads prepared tensors)."""
        if name in self._cache:
            return self._cache[name]
        if not self._banks:
            raise RuntimeError("SyntheticAdapters.prepare() was not called")
        i = self._index[name]
        bank = self._banks[i % len(self._banks)]
        mags = self._magnitudes[i % len(self._banks)] if self.dora else {}
        scaling = self._scaling(i)
        modules, magnitudes, experts = {}, {}, {}
        for (layer, m), (a, b) in bank.items():
            if m.startswith("experts."):  # as adapters/experts.py reads the checkpoint: A [E, r, in], B [E, out, r]
                E, r = self.model_config.moe.num_experts, self.rank
                a_e, b_e = a.view(E, r, a.shape[1]), b.view(b.shape[0], r, E).permute(2, 0, 1)
                if m == "experts.down_proj":
                    experts[(layer, "down")] = (a_e, b_e, scaling)
                else:
                    inter = b.shape[0] // 2
                    experts[(layer, "gate")] = (a_e, b_e[:, :inter], scaling)
                    experts[(layer, "up")] = (a_e, b_e[:, inter:], scaling)
                continue
            if m not in CHECKPOINT_FUSED:
                modules[(layer, m)] = LoraModule(a=a, b=b, scaling=scaling)
                if mags:
                    magnitudes[(layer, m)] = mags[(layer, m)].float()
                continue
            lo = 0  # a fused module (Phi-3) as its slices, as adapters/scan.py splits a checkpoint's
            for piece, rows in self.model_config.checkpoint_slices(m):
                modules[(layer, piece)] = LoraModule(a=a, b=b[lo : lo + rows], scaling=scaling)
                if mags:
                    magnitudes[(layer, piece)] = mags[(layer, m)][lo : lo + rows].float()
                lo += rows
        adapter = LoraAdapter(
            name=name,
            path=Path("synthetic") / name,
            config=None,
            modules=modules,
            base_model=None,
            weights_path=Path("synthetic") / name,
            stored_dtype=next(iter(bank.values()))[0].dtype,
            stored_nbytes=self.nbytes,
            magnitudes=magnitudes,
            experts=experts,
        )
        self._cache[name] = adapter
        return adapter


class SyntheticEngine(Engine):
    """An `Engine` serving a `SyntheticAdapters` source: its PEFT folders once `prepare` wrote them (call it
    first), else its tensors packed from memory."""

    def __init__(self, config: EngineConfig, source: SyntheticAdapters | None, model_config: ModelConfig | None = None):
        self.source = source
        names = source.names if source is not None else []
        paths = source.paths if source is not None else {}
        super().__init__(config, {n: paths.get(n, Path("synthetic") / n) for n in names}, model_config)

    def _uses_dora(self) -> bool:
        return self.source is not None and self.source.dora

    def _from_memory(self, name: str) -> bool:
        return self.adapters[name] != self.source.paths.get(name)

    def _load_cpu(self, name: str) -> LoraAdapter:
        if self._from_memory(name):
            return self._pack(self.source.load(name))  # as Engine._load_cpu packs after its disk read
        return super()._load_cpu(name)

    def _adapter_nbytes(self, name: str) -> int:
        if self._from_memory(name):
            return self.source.nbytes * self.runner.dtype.itemsize // 2
        return super()._adapter_nbytes(name)  # from the file, as for a user's adapter
