"""The vocabulary-sized modules of a PEFT adapter: LoRA on `embed_tokens` / `lm_head` and `modules_to_save` copies.

What PEFT writes (peft 0.21, keys after `base_model.model.`):
- embedding LoRA: `model.embed_tokens.lora_embedding_A` [r, V] and `.lora_embedding_B` [H, r] (parameters, no
  `.weight`); PEFT's `Embedding` adds `s · A.T[ids] @ B.T` to `E[ids]` (before any embedding scale: Gemma's
  scaled embedding multiplies the delta too), s = alpha / r (or / sqrt(r)) as for a linear LoRA;
- lm_head LoRA: `lm_head.lora_A.weight` [r, H], `lm_head.lora_B.weight` [V, r]: a linear LoRA on the head;
- `modules_to_save`: the trained copy itself, `lm_head.weight` / `model.embed_tokens.weight` [V, H];
- with an embedding layer in target_modules PEFT also saves the base layer (`...embed_tokens.base_layer.weight`,
  `lm_head.base_layer.weight`) and loads it back over the base's: equal to the base's unless the vocabulary was
  resized or trained. The engine checks it against the base when it loads the adapter (`base_copies`) and refuses
  a copy that differs; a shape that differs is refused here, from the header.
Anything else about these modules (DoRA on them, biases, LoRA and modules_to_save on the same one) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from multilora_cli.errors import AdapterError

VOCAB_MODULES = ("embed_tokens", "lm_head")
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<full>(?:[A-Za-z0-9_.]*\.)?(?P<module>embed_tokens|lm_head))\."
    r"(?P<kind>lora_embedding_A|lora_embedding_B|lora_A|lora_B|base_layer|modules_to_save)"
    r"(?:\.[A-Za-z0-9_]+)?(?:\.weight)?$"
    r"|^(?:base_model\.model\.)?(?P<full2>(?:[A-Za-z0-9_.]*\.)?(?P<module2>embed_tokens|lm_head))\.weight$"
)
_KIND = {"lora_embedding_A": "A", "lora_embedding_B": "B", "lora_A": "A", "lora_B": "B"}


def vocab_key(key: str) -> tuple[str, str, str] | None:
    """(full module name, "embed_tokens" | "lm_head", "A" | "B" | "full" | "base") for a key of these modules
    that is served, None otherwise (the caller names what it is)."""
    m = _KEY.match(key)
    if m is None:
        return None
    if m.group("full2"):
        return m.group("full2"), m.group("module2"), "full"
    kind = m.group("kind")
    module = m.group("module")
    if kind in ("lora_embedding_A", "lora_embedding_B") and module != "embed_tokens":
        return None
    if kind in ("lora_A", "lora_B") and module != "lm_head":
        return None
    if kind == "modules_to_save":  # a state dict saved with its adapter name left in: same copy
        return m.group("full"), module, "full"
    return m.group("full"), module, _KIND.get(kind, "base")


@dataclass(frozen=True, slots=True)
class VocabLoraSpec:
    """One vocab module's LoRA as the header describes it: A [r, in], B [out, r] (embed_tokens: in = V, out = H;
    lm_head: in = H, out = V)."""

    key_a: str
    key_b: str
    rank: int
    scaling: float


@dataclass(slots=True)
class VocabScan:
    """Keys of the vocabulary modules of one checkpoint, checked against the base's shapes."""

    lora: dict[str, VocabLoraSpec] = field(default_factory=dict)  # module -> its LoRA
    full: dict[str, str] = field(default_factory=dict)  # module -> key of its modules_to_save copy [V, H]
    base: dict[str, str] = field(default_factory=dict)  # module -> key of a saved base layer [V, H] (checked)

    def __bool__(self) -> bool:
        return bool(self.lora or self.full or self.base)

    @property
    def max_rank(self) -> int:
        return max((s.rank for s in self.lora.values()), default=0)

    def features(self) -> list[str]:
        """What the adapter adapts here, in words (inspect)."""
        out = [f"LoRA on {m} (r={s.rank})" for m, s in self.lora.items()]
        return out + [f"a trained {m} (modules_to_save)" for m in self.full]


@dataclass(slots=True)
class VocabWeights:
    """The loaded vocab modules of an adapter. embed: a = lora_embedding_A [r, V], b = lora_embedding_B [H, r];
    head: a = lora_A [r, H], b = lora_B [V, r]; *_full: modules_to_save copies [V, H]; base_copies: module ->
    a reader of its saved base layer [V, H], which the engine compares with the base's once per adapter (read only
    then: a Llama-3-8B copy is 1-2 GB)."""

    embed: object | None = None  # adapters.peft.LoraModule
    head: object | None = None
    embed_full: torch.Tensor | None = None
    head_full: torch.Tensor | None = None
    base_copies: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)

    @property
    def max_rank(self) -> int:
        return max([m.rank for m in (self.embed, self.head) if m is not None], default=0)

    @property
    def num_params(self) -> int:
        n = sum(m.a.numel() + m.b.numel() for m in (self.embed, self.head) if m is not None)
        return n + sum(t.numel() for t in (self.embed_full, self.head_full) if t is not None)


def check_vocab(name: str, where: str, tf, keys: dict[str, dict[str, str]], config, vocab_size, hidden) -> VocabScan:
    """Validate the vocab keys of checkpoint `tf` ({module: {"A" | "B" | "full" | "base": key}}) against the
    adapter config and, when given, the base's vocab_size / hidden size. Raises AdapterError."""
    out = VocabScan()
    for module, kinds in sorted(keys.items()):
        at = f"adapter {name!r}: {where}: {module}"
        has_lora = "A" in kinds or "B" in kinds
        if has_lora and "full" in kinds:
            raise AdapterError(
                f"{at} has both LoRA tensors and a modules_to_save copy", hint="re-save the adapter with PEFT"
            )
        if has_lora:
            for ab in ("A", "B"):
                if ab not in kinds:
                    raise AdapterError(
                        f"{at} has lora_{'B' if ab == 'A' else 'A'} but no lora_{ab}",
                        hint="the checkpoint is incomplete; re-save or re-download it",
                    )
            sa, sb = tf.shape(kinds["A"]), tf.shape(kinds["B"])
            if len(sa) != 2 or len(sb) != 2 or sa[0] != sb[1] or sa[0] == 0:
                raise AdapterError(
                    f"{at}: LoRA A {tuple(sa)} and B {tuple(sb)} are not a [r, in] / [out, r] pair",
                    hint="the checkpoint is corrupt; re-save it",
                )
            want_in, want_out = (vocab_size, hidden) if module == "embed_tokens" else (hidden, vocab_size)
            if vocab_size is not None and (sa[1], sb[0]) != (want_in, want_out):
                raise _misfit(at, f"LoRA maps {sa[1]} -> {sb[0]} features, the base's {module} {want_in} -> {want_out}")
            full = kinds["A"].removeprefix("base_model.model.").rsplit(f"{module}.", 1)[0] + module
            if not config.target_matches(full):
                raise AdapterError(
                    f"{at} has LoRA tensors but adapter_config.json target_modules does not select it "
                    "(PEFT would ignore them)",
                    hint="fix target_modules or re-save the adapter with PEFT",
                )
            r = sa[0]
            if r != config.rank_for(full):
                raise AdapterError(
                    f"{at} has rank {r} but adapter_config.json gives it r={config.rank_for(full)}",
                    hint="fix adapter_config.json so PEFT and multilora agree",
                )
            out.lora[module] = VocabLoraSpec(kinds["A"], kinds["B"], r, config.scaling_for(full, r))
        if "full" in kinds and not any(m.split(".")[-1] == module for m in config.modules_to_save or []):
            raise AdapterError(
                f"{at}: the checkpoint holds a trained copy ({kinds['full']}) but adapter_config.json "
                "modules_to_save does not name it (PEFT would ignore it)",
                hint="fix modules_to_save or re-save the adapter with PEFT",
            )
        for kind, into in (("full", out.full), ("base", out.base)):
            if kind not in kinds:
                continue
            shape = tuple(tf.shape(kinds[kind]))
            if vocab_size is not None and shape != (vocab_size, hidden):
                what = "modules_to_save copy" if kind == "full" else "saved base layer"
                raise _misfit(
                    at,
                    f"its {what} is {list(shape)}, the base's {module} is [{vocab_size}, {hidden}] "
                    "(a resized vocabulary?)",
                )
            into[module] = kinds[kind]
        for key in kinds.values():
            if not tf.dtype(key).is_floating_point:
                raise AdapterError(f"{at}: {key} has dtype {tf.dtype(key)}; weights must be floating point")
    return out


def _misfit(at: str, what: str) -> AdapterError:
    return AdapterError(
        f"{at}: {what}",
        hint="pass the base model the adapter was trained on with --model (multilora does not serve resized "
        "vocabularies)",
    )
