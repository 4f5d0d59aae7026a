"""The rows of `multilora inspect`'s report: the adapter's LoRA modules (decoder modules as the checkpoint holds
them, MoE experts, embed_tokens / lm_head) grouped by rank, alpha and shape, and what it holds beyond LoRA pairs
(DoRA magnitudes, modules_to_save copies, vocabulary-sized slots) with their costs."""

from __future__ import annotations

from dataclasses import dataclass

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.models.config import CHECKPOINT_MODULES, ModelConfig


@dataclass(slots=True)
class ModuleRow:
    """Modules of one PEFT name sharing rank and alpha; `params` sums A and B over `layers`."""

    module: str
    layers: list[int]
    rank: int
    alpha: float
    scaling: float
    in_features: int
    out_features: int
    params: int


@dataclass(slots=True)
class ExtraCost:
    """A served feature beyond plain LoRA pairs and what it costs: `params` stored in the adapter, `slot_bytes` the
    GPU memory it adds to each slot of a run (None when the base's shapes are unknown)."""

    kind: str  # "dora"
    params: int
    bytes_bf16: int
    slot_bytes: int | None
    note: str


def lora_rows(adapter, config: AdapterConfig) -> list[ModuleRow]:
    """The adapter's LoRA pairs on decoder modules, one row per (module, rank, alpha, shape), in the checkpoint
    modules' order."""
    # modules as the checkpoint holds them: the slices of a fused module (Phi-3's qkv_proj, split for the slots)
    # are one module again, with one lora_A and all rows of lora_B
    held: dict[tuple[int, str], tuple[object, int, str]] = {}  # (layer, module) -> (a LoraModule, out rows, name)
    for key, m in adapter.modules.items():
        full = adapter.module_names[key]
        leaf = full.rsplit(".", 1)[-1]
        leaf = f"shared_expert.{leaf}" if full.endswith(f".shared_expert.{leaf}") else leaf  # Qwen2-MoE
        first, rows, _ = held.get((key[0], leaf), (m, 0, full))
        held[(key[0], leaf)] = (first, rows + m.b.shape[0], full)
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for (layer, module), (m, out, full) in held.items():
        order = CHECKPOINT_MODULES.index(module) if module in CHECKPOINT_MODULES else len(CHECKPOINT_MODULES)
        key = (order, module, m.rank, config.alpha_for(full), m.scaling, m.a.shape[1], out)
        groups.setdefault(key, []).append((layer, m.rank * (m.a.shape[1] + out)))
    return [
        ModuleRow(
            module=k[1],
            layers=sorted(layer for layer, _ in ms),
            rank=k[2],
            alpha=k[3],
            scaling=k[4],
            in_features=k[5],
            out_features=k[6],
            params=sum(p for _, p in ms),
        )
        for k, ms in sorted(groups.items(), key=lambda kv: (kv[0][0], min(layer for layer, _ in kv[1])))
    ]


def extra_costs(adapter, model_config: ModelConfig | None) -> list[ExtraCost]:
    """What the adapter holds beyond LoRA pairs, and its cost (engine/dora.py, engine/slot_budget.py)."""
    from multilora_cli.adapters.costs import dora_slot_bytes, full_copy_bytes, vocab_lora_slot_bytes

    out = []
    vocab = adapter.vocab
    for module, m in (("embed_tokens", vocab.embed), ("lm_head", vocab.head)) if vocab is not None else ():
        if m is not None:  # its A / B are module rows; the run's slots are vocabulary-sized
            out.append(
                ExtraCost(
                    kind=f"{module}_lora",
                    params=0,
                    bytes_bf16=0,
                    slot_bytes=vocab_lora_slot_bytes(model_config, module, m.rank) if model_config else None,
                    note=f"LoRA on {module}: vocabulary-sized slots in every GPU slot of the run (here at its rank "
                    f"{m.rank}; the run's --max-lora-rank sizes them)",
                )
            )
    for module, t in (("embed_tokens", vocab.embed_full), ("lm_head", vocab.head_full)) if vocab is not None else ():
        if t is not None:
            out.append(
                ExtraCost(
                    kind=f"{module}_modules_to_save",
                    params=t.numel(),
                    bytes_bf16=2 * t.numel(),
                    slot_bytes=full_copy_bytes(model_config, 2) if model_config else None,
                    note=f"modules_to_save: a full trained {module} [{t.shape[0]}, {t.shape[1]}], one copy on the GPU "
                    "per slot this adapter holds",
                )
            )
    if adapter.magnitudes:
        # a fused checkpoint module's slices share its vector: count each stored value once, by its rows
        n = sum(m.numel() for m in adapter.magnitudes.values())
        out.append(
            ExtraCost(
                kind="dora",
                params=n,
                bytes_bf16=2 * n,
                slot_bytes=dora_slot_bytes(model_config) if model_config is not None else None,
                note="DoRA: magnitude vectors; m / ||W + s·B·A|| computed once per slot load, applied per row",
            )
        )
    return out


def vocab_rows(adapter, config: AdapterConfig) -> list[ModuleRow]:
    """LoRA on embed_tokens / lm_head (adapters/vocab.py) as module rows without layers: embed_tokens maps V -> H
    (its A is [r, V]), lm_head H -> V."""
    vocab, rows = adapter.vocab, []
    for module, m in (("embed_tokens", vocab.embed), ("lm_head", vocab.head)) if vocab is not None else ():
        if m is None:
            continue
        fin, fout = m.a.shape[1], m.b.shape[0]
        alpha = m.scaling * (m.rank**0.5 if config.use_rslora else m.rank)
        rows.append(ModuleRow(module, [], m.rank, alpha, m.scaling, fin, fout, m.rank * (fin + fout)))
    return rows


def expert_rows(adapter, config: AdapterConfig) -> list[ModuleRow]:
    """MoE expert LoRA (adapters/experts.py) as rows "experts.gate" / "experts.up" / "experts.down": rank per expert,
    params over all E experts as the slots hold them (PEFT's gate_up_proj A counted for gate and for up)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for (layer, part), (a, b, scaling) in adapter.experts.items():
        key = (("gate", "up", "down").index(part), f"experts.{part}", a.shape[1], scaling, a.shape[2], b.shape[1])
        groups.setdefault(key, []).append((layer, a.numel() + b.numel()))
    return [
        ModuleRow(
            module=k[1],
            layers=sorted(layer for layer, _ in ms),
            rank=k[2],
            alpha=k[3] * (k[2] ** 0.5 if config.use_rslora else k[2]),
            scaling=k[3],
            in_features=k[4],
            out_features=k[5],
            params=sum(p for _, p in ms),
        )
        for k, ms in sorted(groups.items())
    ]
