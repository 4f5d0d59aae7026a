"""`AdapterConfig`: the fields of a PEFT `adapter_config.json` that decide which modules a LoRA touches and
how strongly, with PEFT's own matching rules.

PEFT semantics reproduced here (peft 0.21 `check_target_module_exists`, `get_pattern_key`, `LoraLayer`):
- `target_modules` list: a module matches if its full name is in the list or ends with ".<item>"; only in
  that suffix case do `layers_to_transform` / `layers_pattern` restrict layers. A string is a regex that must
  match the full name (`re.fullmatch`). "all-linear" = every linear layer but the output head.
- `exclude_modules` (list: exact or suffix; string: fullmatch) and `modules_to_save` names never match.
- `rank_pattern` / `alpha_pattern`: the first key k with `re.match(rf"(.*\\.)?({k})$", name)` wins.
- scaling = alpha / r, or alpha / sqrt(r) with `use_rslora`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from multilora_cli.errors import AdapterError
from multilora_cli.models.config import CHECKPOINT_MODULES

CONFIG_NAME = "adapter_config.json"
_BIAS = ("none", "all", "lora_only")


@dataclass(slots=True)
class AdapterConfig:
    """A parsed, validated `adapter_config.json`. `source` names the file in error messages."""

    r: int = 8
    lora_alpha: float = 8
    use_rslora: bool = False
    target_modules: list[str] | str | None = None
    exclude_modules: list[str] | str | None = None
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    layers_to_transform: list[int] | int | None = None
    layers_pattern: list[str] | str | None = None
    base_model_name_or_path: str | None = None
    revision: str | None = None
    bias: str = "none"
    use_dora: bool = False
    modules_to_save: list[str] | None = None
    fan_in_fan_out: bool = False
    peft_type: str = "LORA"
    task_type: str | None = None
    extra: dict = field(default_factory=dict)  # every other key, kept for feature checks and reports
    source: str = CONFIG_NAME

    def __post_init__(self) -> None:
        def bad(what: str) -> AdapterError:
            return AdapterError(
                f"{self.source}: {what}", hint="fix adapter_config.json or re-save the adapter with PEFT"
            )

        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise bad(f"r must be a positive integer (the LoRA rank), got {self.r!r}")
        if (
            isinstance(self.lora_alpha, bool)
            or not isinstance(self.lora_alpha, (int, float))
            or not math.isfinite(self.lora_alpha)
        ):
            raise bad(f"lora_alpha must be a number, got {self.lora_alpha!r}")
        if isinstance(self.target_modules, (list, tuple, set)):
            self.target_modules = sorted(str(t) for t in self.target_modules)
        elif self.target_modules is not None and not isinstance(self.target_modules, str):
            raise bad(f"target_modules must be a list of names or a regex string, got {self.target_modules!r}")
        if isinstance(self.target_modules, str):
            try:
                re.compile(self.target_modules)
            except re.error as e:
                raise bad(f"target_modules regex {self.target_modules!r} is invalid: {e}") from None
        if isinstance(self.exclude_modules, (tuple, set)):
            self.exclude_modules = sorted(self.exclude_modules)
        # hand-edited configs: a wrong type here failed later as an internal error (TypeError, re.error)
        if self.exclude_modules is not None and not isinstance(self.exclude_modules, (list, str)):
            raise bad(f"exclude_modules must be a list of names or a regex string, got {self.exclude_modules!r}")
        if isinstance(self.exclude_modules, str):
            try:
                re.compile(self.exclude_modules)
            except re.error as e:
                raise bad(f"exclude_modules regex {self.exclude_modules!r} is invalid: {e}") from None
        if self.modules_to_save is not None and not (
            isinstance(self.modules_to_save, list) and all(isinstance(m, str) for m in self.modules_to_save)
        ):
            raise bad(f"modules_to_save must be a list of module names, got {self.modules_to_save!r}")
        if self.base_model_name_or_path is not None and not isinstance(self.base_model_name_or_path, str):
            raise bad(f"base_model_name_or_path must be a string, got {self.base_model_name_or_path!r}")
        for name, pattern, kind in (
            ("rank_pattern", self.rank_pattern, int),
            ("alpha_pattern", self.alpha_pattern, float),
        ):
            if not isinstance(pattern, dict):
                raise bad(f"{name} must be an object, got {pattern!r}")
            for key, value in pattern.items():
                ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
                if not ok or isinstance(value, bool) or (kind is int and value <= 0):
                    raise bad(
                        f"{name}[{key!r}] must be a positive {'integer' if kind is int else 'number'}, got {value!r}"
                    )
                try:
                    re.compile(key)
                except re.error as e:
                    raise bad(f"{name} key {key!r} is not a valid regex: {e}") from None
        if self.bias not in _BIAS:
            raise bad(f"bias must be one of {', '.join(_BIAS)}, got {self.bias!r}")
        ltt = self.layers_to_transform
        if not (
            ltt is None
            or (isinstance(ltt, int) and not isinstance(ltt, bool))
            or (isinstance(ltt, list) and all(isinstance(i, int) for i in ltt))
        ):
            raise bad(f"layers_to_transform must be an integer or a list of integers, got {ltt!r}")
        self.peft_type = str(self.peft_type or "LORA").upper()

    # Parsing ------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict, source: str = CONFIG_NAME) -> AdapterConfig:
        """Build from a parsed adapter_config.json; unknown keys go to `extra`."""
        if not isinstance(raw, dict):
            raise AdapterError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        names = {f for f in cls.__dataclass_fields__ if f not in ("extra", "source")}
        kw = {k: v for k, v in raw.items() if k in names and v is not None}
        for key in ("rank_pattern", "alpha_pattern"):
            kw[key] = kw.get(key) or {}
        return cls(**kw, extra={k: v for k, v in raw.items() if k not in names}, source=source)

    @classmethod
    def from_dir(cls, path: str | Path) -> AdapterConfig:
        """Read `<path>/adapter_config.json`. Raises AdapterError if missing or not valid JSON."""
        p = Path(path) / CONFIG_NAME
        if not p.is_file():
            raise AdapterError(f"{path}: no {CONFIG_NAME}", hint=_no_config_hint(Path(path)))
        try:
            raw = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise AdapterError(f"{p}: unreadable JSON: {e}", hint="re-save or re-download the adapter") from None
        return cls.from_dict(raw, source=str(p))

    # PEFT rules ---------------------------------------------------------------------------------
    def target_matches(self, module_full_name: str) -> bool:
        """Whether PEFT would put a LoRA on the module named `module_full_name` (e.g. model.layers.0.self_attn.q_proj)."""
        key = module_full_name
        if self.exclude_modules:
            if isinstance(self.exclude_modules, str):
                if re.fullmatch(self.exclude_modules, key):
                    return False
            elif key in self.exclude_modules or any(key.endswith(f".{e}") for e in self.exclude_modules):
                return False
        if self.modules_to_save and any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in self.modules_to_save):
            return False
        targets = self.target_modules
        if targets is None:  # PEFT always writes them; with none we trust the tensors
            return True
        if targets == "all-linear":  # every linear layer of the decoder (Phi-3's are qkv_proj, gate_up_proj, ...)
            targets = list(CHECKPOINT_MODULES)
        elif isinstance(targets, str):
            return re.fullmatch(targets, key) is not None
        if key in targets:
            return True
        if not any(key.endswith(f".{t}") for t in targets):
            return False
        return self._layer_selected(key)

    def _layer_selected(self, key: str) -> bool:
        wanted = self.layers_to_transform
        if wanted is None or (isinstance(wanted, list) and not wanted):
            return True
        patterns = self.layers_pattern
        match = None
        if not patterns:
            match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)  # first numbered segment = the layer
        else:
            for pattern in [patterns] if isinstance(patterns, str) else patterns:
                match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
                if match:
                    break
        if not match:
            return False
        idx = int(match.group("idx"))
        return idx == wanted if isinstance(wanted, int) else idx in wanted

    @staticmethod
    def _pattern_value(pattern: dict, name: str):
        for key, value in pattern.items():
            if re.match(rf"(.*\.)?({key})$", name):
                return value
        return None

    def rank_for(self, name: str) -> int:
        """The rank PEFT gives module `name`: rank_pattern's first matching key, else r."""
        value = self._pattern_value(self.rank_pattern, name)
        return self.r if value is None else int(value)

    def alpha_for(self, name: str) -> float:
        """The lora_alpha PEFT gives module `name`: alpha_pattern's first matching key, else lora_alpha."""
        value = self._pattern_value(self.alpha_pattern, name)
        return self.lora_alpha if value is None else value

    def scaling_for(self, name: str, r: int | None = None) -> float:
        """alpha / r (alpha / sqrt(r) with rsLoRA) for module `name`; r defaults to rank_for(name)."""
        r = self.rank_for(name) if r is None else r
        alpha = self.alpha_for(name)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    # Features -----------------------------------------------------------------------------------
    def names_vocab_modules(self) -> bool:
        """Whether this config may give the adapter embed_tokens / lm_head tensors (LoRA on them, or
        modules_to_save copies): a cheap test before reading the header (a target regex is taken as maybe)."""
        heads = ("embed_tokens", "lm_head")
        if any(m.split(".")[-1] in heads for m in self.modules_to_save or []):
            return True
        if isinstance(self.target_modules, str):
            return self.target_modules != "all-linear"
        return any(t.split(".")[-1] in heads for t in self.target_modules or [])

    def unsupported(self) -> list[str]:
        """PEFT features this adapter uses that multilora cannot serve yet, each named for the user."""
        out = []
        if self.peft_type != "LORA":
            out.append(f"peft_type {self.peft_type} (only LoRA adapters are served)")
        # bias != "none" is judged by the tensors (scan.py): PEFT saves the trained biases it has, and on a base
        # without linear biases (Llama, Mistral, Qwen3) there are none, so PEFT's output is a plain LoRA's.
        # fan_in_fan_out is not a feature either: PEFT resets it to False on every nn.Linear (the only layers
        # served), so A / B are stored and applied exactly as without it.
        if self.extra.get("lora_bias"):
            out.append("LoRA bias (lora_bias=true)")
        # modules_to_save copies of embed_tokens / lm_head and LoRA on them are served (adapters/vocab.py); a
        # trained copy of any other module (a norm, a classifier head) is not
        other = [m for m in self.modules_to_save or [] if m.split(".")[-1] not in ("embed_tokens", "lm_head")]
        if other:
            out.append(f"modules_to_save={other} (fully trained modules other than embed_tokens / lm_head)")
        params = self.extra.get("target_parameters") or []
        other = [p for p in params if not _expert_param(str(p))]
        router = [p for p in other if str(p).split(".")[-2:-1] == ["gate"]]
        if router:
            out.append(f"LoRA on the MoE router ({router[0]}), which is not a LoRA target multilora serves")
        other = [p for p in other if p not in router]
        if other:  # the MoE expert parameters are served (adapters/experts.py), nothing else
            out.append(f"LoRA on parameters {other} (target_parameters)")
        for key, label in (
            ("trainable_token_indices", "trainable token embeddings (trainable_token_indices)"),
            ("layer_replication", "layer_replication"),
            ("alora_invocation_tokens", "activated LoRA (alora_invocation_tokens)"),
            ("use_qalora", "QALoRA (use_qalora=true)"),
            ("use_bdlora", "block-diagonal LoRA (use_bdlora)"),
        ):
            if self.extra.get(key):
                out.append(label)
        return out


def _expert_param(entry: str) -> bool:
    """Whether a target_parameters entry names MoE expert parameters (served: adapters/experts.py). PEFT matches an
    entry against `<module>.<param>` as equal or a dotted suffix, and writes both "mlp.experts.gate_up_proj" and,
    converting target_modules gate_proj / up_proj / down_proj on a transformers 5 MoE, plain "gate_up_proj"."""
    parts = entry.split(".")
    return parts[-1] in ("gate_up_proj", "down_proj") and (len(parts) == 1 or parts[-2] == "experts")


def _no_config_hint(folder: Path) -> str:
    """What a folder without adapter_config.json holds instead, so the hint says where to point."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        entries = []
    subs = [e.name for e in entries if e.is_dir() and (e / CONFIG_NAME).is_file()]
    if subs:
        listed = ", ".join(subs[:5]) + (f", ... ({len(subs)} in all)" if len(subs) > 5 else "")
        return (
            f"it holds adapters in subfolders ({listed}): point at one, e.g. {folder / subs[0]}, "
            "or pass the folder to `multilora run --adapter-dir`"
        )
    if (folder / "config.json").is_file():
        return "it is a base model folder (config.json), not an adapter: pass it with --model"
    if not entries:
        return "the folder is empty; point at a PEFT LoRA adapter folder (saved with save_pretrained)"
    return "point at a PEFT LoRA adapter folder (saved with save_pretrained)"
