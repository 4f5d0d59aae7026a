"""The adapter layer: from a name on the command line to validated LoRA tensors ready for slots.

- `resolve.py`   local path / `~` / Hugging Face Hub id -> local folder (adapters and base models)
- `config.py`    `AdapterConfig`: adapter_config.json with PEFT's target / layer / rank / alpha rules
- `tensors.py`   reading adapter_model.safetensors (memory-mapped) or .bin (weights_only) and sorting keys
- `peft.py`      `load_adapter` -> `LoraAdapter` (A, B, scaling per (layer, module)), validation
- `preflight.py` `parse_adapter_specs`, `preflight`: everything a run checks before GPU work
- `report.py`, `render.py`  what `multilora inspect` shows

Modules import torch only where tensors are touched; import them directly (this package imports nothing).
"""
