"""Read the tensors of a PEFT adapter checkpoint and sort its keys into LoRA pairs and unsupported extras.

`adapter_model.safetensors` is opened memory-mapped (`safe_open`), so reading the key list costs nothing and
only the tensors asked for are paged in. Legacy `adapter_model.bin` is loaded with
`torch.load(weights_only=True)` and nothing else: a pickle that needs code to run is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from multilora_cli.errors import AdapterError
from multilora_cli.models.config import ATTN_MODULES, LINEAR_MODULES

SAFETENSORS_NAME = "adapter_model.safetensors"
BIN_NAME = "adapter_model.bin"

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (also ".lora_A.default.weight", and without
# the "base_model.model." prefix). `module` is the name PEFT matches target_modules against.
LORA_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>(?:[A-Za-z0-9_.]*\.)?layers\.(?P<layer>\d+)\.(?P<parent>[A-Za-z_]\w*)"
    r"\.(?P<name>[A-Za-z_]\w*))\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$"
)
_PARENT = {m: ("self_attn" if m in ATTN_MODULES else "mlp") for m in LINEAR_MODULES}


def weights_file(path: Path, name: str) -> Path:
    """The weights file of adapter folder `path`: safetensors preferred, legacy .bin accepted."""
    for fname in (SAFETENSORS_NAME, BIN_NAME):
        if (path / fname).is_file():
            return path / fname
    raise AdapterError(f"adapter {name!r} ({path}): no {SAFETENSORS_NAME} or {BIN_NAME}",
                       hint="point at a PEFT adapter folder saved with save_pretrained")


class TensorFile:
    """Uniform read access to one adapter weights file. Errors name the adapter and file."""

    def __init__(self, file: Path, adapter: str):
        self.file = file
        self.adapter = adapter
        self._st = None
        self._tensors: dict[str, torch.Tensor] | None = None
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                self._st = safe_open(str(file), framework="pt")
                self._keys = list(self._st.keys())
            except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: header corrupt or truncated
                raise self.corrupt(e) from None
        else:
            try:
                obj = torch.load(str(file), map_location="cpu", weights_only=True, mmap=False)
            except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError, ...
                if "Unsupported global" in str(e):
                    raise AdapterError(
                        f"adapter {self.adapter!r}: {file} holds more than plain tensors and was not unpickled "
                        "(only torch.load(weights_only=True) is used)",
                        hint="re-save the adapter with PEFT save_pretrained (safetensors)",
                    ) from None
                raise self.corrupt(e) from None
            if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
                raise AdapterError(f"adapter {self.adapter!r}: {file} is not a state dict of tensors",
                                   hint="re-save the adapter with PEFT save_pretrained")
            self._tensors = obj
            self._keys = list(obj)

    def corrupt(self, e: BaseException) -> AdapterError:
        detail = _short(e)
        return AdapterError(f"adapter {self.adapter!r}: {self.file} is corrupt or truncated ({detail})",
                            hint="re-download or re-save the adapter")

    def keys(self) -> list[str]:
        return self._keys

    def shape(self, key: str) -> tuple[int, ...]:
        if self._tensors is not None:
            return tuple(self._tensors[key].shape)
        try:
            return tuple(self._st.get_slice(key).get_shape())
        except Exception as e:  # noqa: BLE001
            raise self.corrupt(e) from None

    def get(self, key: str) -> torch.Tensor:
        if self._tensors is not None:
            return self._tensors[key]
        try:
            return self._st.get_tensor(key)
        except Exception as e:  # noqa: BLE001 - data region shorter than the header says
            raise self.corrupt(e) from None


def classify_key(key: str) -> tuple[str, int, str, str] | str:
    """A LoRA key -> (module full name, layer, PEFT module name, "A"|"B"); anything else -> why it is unservable."""
    m = LORA_KEY.match(key)
    if m and _PARENT.get(m.group("name")) == m.group("parent"):
        return m.group("module"), int(m.group("layer")), m.group("name"), m.group("ab")
    if "lora_magnitude_vector" in key:
        return "DoRA (lora_magnitude_vector tensors)"
    if "lora_embedding_A" in key or "lora_embedding_B" in key:
        return "embedding LoRA (lora_embedding_A/B)"
    if "lm_head" in key:
        return "LoRA on lm_head" if ".lora_" in key else "a trained lm_head (modules_to_save)"
    if "embed_tokens" in key:
        return "trained embed_tokens (modules_to_save or trainable tokens)"
    if key.endswith(".bias"):
        return "LoRA bias (lora_B.bias)" if ".lora_B" in key else "trained biases"
    if m or ".lora_A" in key or ".lora_B" in key:
        return f"LoRA on a module multilora does not serve ({key}; served: {', '.join(LINEAR_MODULES)})"
    return f"an unexpected tensor {key!r}"


def _short(e: BaseException) -> str:
    """One short line from a library exception (torch's unpickler errors run to a dozen lines)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if "WeightsUnpickler error:" in ln:
            return ln.split("WeightsUnpickler error:", 1)[1].strip() or ln
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
