"""Adapter shapes: how many LoRA parameters an adapter holds, per module, from flags or a real adapter.

A LoRA module on a linear layer W: [out, in] holds A: [r, in] and B: [out, r], so r * (in + out) params per
targeted module per layer. `AdapterShape` keeps one row per (module, rank) so adapters with a rank_pattern are
counted exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multilora_cli.errors import AdapterError, UsageError
from multilora_cli.models.config import ATTN_MODULES, LINEAR_MODULES, MLP_MODULES, ModelConfig

TARGET_GROUPS = {"all": LINEAR_MODULES, "all-linear": LINEAR_MODULES, "attn": ATTN_MODULES, "mlp": MLP_MODULES}
DEFAULT_TARGETS = ATTN_MODULES  # q,k,v,o: the seeds' (and PEFT examples') usual choice
DEFAULT_RANK = 16


@dataclass(slots=True, frozen=True)
class ModuleShape:
    """One targeted module kind at one rank: `layers` layers of A [rank, in] and B [out, rank]."""

    module: str
    in_features: int
    out_features: int
    rank: int
    layers: int

    @property
    def params_per_layer(self) -> int:
        return self.rank * (self.in_features + self.out_features)

    @property
    def params(self) -> int:
        return self.params_per_layer * self.layers


@dataclass(slots=True)
class AdapterShape:
    """A LoRA adapter's parameter layout; `source` says where it came from (flags or an adapter path)."""

    modules: list[ModuleShape]
    source: str
    ranks: list[int] = field(default_factory=list)
    dora_params: int = 0  # DoRA: magnitude values (one per output feature of each adapted module), 0 for LoRA
    # modules_to_save copies of embed_tokens / lm_head ([V, H] each): stored, moved and held per GPU slot
    full_params: int = 0

    def __post_init__(self) -> None:
        if not self.modules:
            raise AdapterError(f"{self.source}: the adapter has no LoRA modules on decoder linear layers")
        self.ranks = sorted({m.rank for m in self.modules})

    @property
    def params(self) -> int:
        return sum(m.params for m in self.modules)

    @property
    def max_rank(self) -> int:
        return self.ranks[-1]

    @property
    def targets(self) -> list[str]:
        dense = [m for m in LINEAR_MODULES if any(s.module == m for s in self.modules)]
        return dense + sorted({s.module for s in self.modules if s.module not in LINEAR_MODULES})  # MoE experts.*


def parse_targets(text: str | None) -> tuple[str, ...]:
    """`q_proj,k_proj` / `all` / `attn` / `mlp` -> PEFT module names in layer order. Unknown names: UsageError."""
    if text is None:
        return DEFAULT_TARGETS
    names: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        group = TARGET_GROUPS.get(item.lower())
        if group is not None:
            names.extend(group)
        elif item in LINEAR_MODULES:
            names.append(item)
        else:
            raise UsageError(
                f"--targets: unknown module {item!r}",
                hint=f"use {', '.join(LINEAR_MODULES)} or a group: {', '.join(TARGET_GROUPS)}",
            )
    if not names:
        raise UsageError("--targets is empty", hint=f"e.g. --targets {','.join(DEFAULT_TARGETS)} or --targets all")
    return tuple(m for m in LINEAR_MODULES if m in names)


def shape_from_flags(model: ModelConfig, rank: int, targets: tuple[str, ...]) -> AdapterShape:
    """Every layer of `model` gets a rank-`rank` LoRA on each of `targets`."""
    if rank <= 0:
        raise UsageError(f"--rank must be a positive integer, got {rank}")
    mods = []
    for t in targets:
        i, o = model.linear_shape(t)
        mods.append(ModuleShape(t, i, o, rank, model.num_hidden_layers))
    return AdapterShape(mods, source=f"--rank {rank} --targets {','.join(targets)}")


def shape_from_modules(
    entries: list[tuple[int, str, int, int, int]], source: str, dora_params: int = 0, full_params: int = 0
) -> AdapterShape:
    """Group per-layer LoRA modules `(layer, module, rank, in, out)` into one row per (module, rank, in, out)."""
    groups: dict[tuple[str, int, int, int], int] = {}
    for _layer, module, r, i, o in entries:
        key = (module, r, i, o)
        groups[key] = groups.get(key, 0) + 1
    order = {m: k for k, m in enumerate(LINEAR_MODULES)}
    rows = [ModuleShape(m, i, o, r, n) for (m, r, i, o), n in groups.items()]
    rows.sort(key=lambda s: (order.get(s.module, len(order)), s.module, s.rank))  # MoE experts.* rows last
    return AdapterShape(rows, source=source, dora_params=dora_params, full_params=full_params)
