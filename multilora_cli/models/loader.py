"""Build a `LlamaForCausalLM` on its device and fill it from Hugging Face safetensors checkpoints.

Reads `model.safetensors` or a sharded `model.safetensors.index.json` through safetensors' mmap, one
tensor at a time (peak host memory ~ one tensor). HF names map onto our fused parameters:
q/k/v_proj -> slices 0/1/2 of qkv_proj, gate/up_proj -> slices 0/1 of gate_up_proj; o_proj and down_proj
are one-slice fused modules. Phi-3 checkpoints hold qkv_proj and gate_up_proj already fused in our row order
(q|k|v, gate|up): they are copied whole. With tied embeddings `lm_head.weight` is absent (or ignored).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import torch

from multilora_cli.errors import ModelError
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.layers.norm import GemmaRMSNorm
from multilora_cli.models.config import FUSED, ModelConfig
from multilora_cli.models.llama import LlamaForCausalLM
from multilora_cli.models.moe_names import expert_target, expert_view, parts_per_param, rename

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}
_FUSED_RE = re.compile(r"^(.*\.)(" + "|".join(FUSED) + r")\.(weight|bias)$")


def resolve_dtype(config_dtype: str | None, requested: str, device: torch.device | str) -> torch.dtype:
    """Pick the compute dtype.

    An explicit `requested` dtype wins. "auto": float32 on CPU; on CUDA the checkpoint's half dtype
    (bfloat16 or float16), and bfloat16 for float32/unspecified checkpoints (float16 if the GPU lacks bf16).
    """
    dev = torch.device(device)
    if requested != "auto":
        if requested not in _DTYPES:
            raise ModelError(f"unknown dtype {requested!r}", hint="use auto, bfloat16, float16 or float32")
        return _DTYPES[requested]
    if dev.type != "cuda":
        return torch.float32
    stored = _DTYPES.get(str(config_dtype).removeprefix("torch."))
    if stored in (torch.bfloat16, torch.float16):
        return stored
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def checkpoint_files(path: Path) -> dict[str, Path]:
    """{tensor name: file} of the model directory (single file or sharded index)."""
    path = Path(path)
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(f"{index}: unreadable shard index: {e}") from None
        files = {name: path / fname for name, fname in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise ModelError(f"{index}: shard {f.name} is missing", hint="download the complete model")
        return files
    if single.is_file():
        from safetensors import safe_open

        try:
            with safe_open(single, framework="pt") as f:
                return {name: single for name in f.keys()}
        except Exception as e:  # noqa: BLE001 - SafetensorError (truncated, not safetensors), OSError
            raise _unreadable(single, e) from None
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise ModelError(
            f"{path}: only PyTorch .bin weights found",
            hint="multilora reads safetensors; re-save with transformers save_pretrained()",
        )
    raise ModelError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _unreadable(file: Path, e: Exception, tensor: str | None = None) -> ModelError:
    what = f"tensor {tensor} of " if tensor else ""
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return ModelError(
        f"{what}{file}: not a readable safetensors file ({why})",
        hint="the file is truncated or corrupt: download the model again",
    )


def _target(name: str) -> tuple[str, int | None]:
    """HF tensor name -> (our parameter name, slice index or None for a whole tensor)."""
    m = _FUSED_RE.match(name)
    if m is None:
        return name, None
    fused, idx = FUSED[m.group(2)]
    return f"{m.group(1)}{fused}.{m.group(3)}", idx


def _hf_name(param: str, idx: int) -> str:
    """Inverse of `_target` for error messages."""
    for peft_name, (fused, i) in FUSED.items():
        if i == idx and f".{fused}." in param:
            return param.replace(f".{fused}.", f".{peft_name}.")
    return param


def load_model(
    path: Path,
    config: ModelConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    max_loras: int = 0,
    max_lora_rank: int = 0,
    lora_targets: set[str] | None = None,
    load_format: str = "auto",
    seed: int = 0,
) -> LlamaForCausalLM:
    """Build the model on `device` in `dtype` and load every weight; raises ModelError naming tensor and file.

    load_format "dummy" reads no checkpoint: weights are random (see `init_dummy_weights`, seeded by `seed`),
    for benchmarks and sizing with real shapes from config.json alone.
    """
    if load_format == "dummy":
        with torch.device(device), _default_dtype(dtype):
            model = LlamaForCausalLM(
                config, max_loras=max_loras, max_lora_rank=max_lora_rank, lora_targets=lora_targets
            )
        init_dummy_weights(model, seed)
        return model.eval()
    if load_format != "auto":
        raise ModelError(f"unknown load format {load_format!r}", hint="use auto or dummy")
    from safetensors import safe_open

    files = checkpoint_files(path)
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(config, max_loras=max_loras, max_lora_rank=max_lora_rank, lora_targets=lora_targets)
    params = dict(model.named_parameters())  # tied lm_head.weight is deduplicated away
    todo = {(n, i) for n, p in params.items() for i in range(_num_slices(model, n))}
    experts_done: dict[str, set] = {}  # 3D expert parameter -> {(expert, part)} loaded from per-expert tensors
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    with torch.no_grad():
        for file, names in sorted(by_file.items()):
            try:
                f = safe_open(file, framework="pt")
            except Exception as e:  # noqa: BLE001 - SafetensorError (truncated, not safetensors), OSError
                raise _unreadable(file, e) from None
            with f:
                for name in names:
                    hit = expert_target(name) if config.moe is not None else None
                    if hit is not None and hit[0] in params:
                        _copy_expert(params[hit[0]], hit, f, name, file)
                        experts_done.setdefault(hit[0], set()).add(hit[1:])
                        continue
                    pname, idx = _target(rename(name) if config.moe is not None else name)
                    if pname not in params:
                        # inv_freq buffers, a tied lm_head, towers of multimodal checkpoints: nothing of ours
                        continue
                    try:
                        tensor = f.get_tensor(name)
                    except Exception as e:  # noqa: BLE001 - a shard's index names a tensor the file lacks, I/O
                        raise _unreadable(file, e, name) from None
                    whole = _copy_into(model, params[pname], pname, idx, tensor, name, file)
                    todo.difference_update((pname, i) for i in (range(whole) if whole else [idx or 0]))
    for pname, done in experts_done.items():
        if len(done) == params[pname].shape[0] * parts_per_param(pname):
            todo.discard((pname, 0))
    if todo:
        missing = sorted(_hf_name(n, i) for n, i in todo)
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelError(
            f"{path}: checkpoint lacks {', '.join(missing[:3])}{more}",
            hint="the checkpoint does not match its config.json",
        )
    return model.eval()


def _copy_expert(param: torch.Tensor, hit: tuple[str, int, str], f, name: str, file: Path) -> None:
    """Copy one expert's checkpoint tensor into its rows of a 3D expert parameter (models/moe_names.py)."""
    pname, expert, part = hit
    if expert >= param.shape[0]:
        raise ModelError(f"{file}: tensor {name} is expert {expert}, but the config has {param.shape[0]} experts")
    dst = expert_view(param, expert, part)
    try:
        tensor = f.get_tensor(name)
    except Exception as e:  # noqa: BLE001 - a shard's index names a tensor the file lacks, I/O
        raise _unreadable(file, e, name) from None
    if tuple(tensor.shape) != tuple(dst.shape):
        raise ModelError(
            f"{file}: tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}",
            hint="the checkpoint does not match its config.json",
        )
    dst.copy_(tensor)


def _module_of(model: torch.nn.Module, pname: str) -> torch.nn.Module:
    return model.get_submodule(pname.rsplit(".", 1)[0]) if "." in pname else model


def _num_slices(model: torch.nn.Module, pname: str) -> int:
    mod = _module_of(model, pname)
    return len(mod.slice_sizes) if isinstance(mod, FusedLinear) else 1


def _copy_into(
    model, param: torch.Tensor, pname: str, idx: int | None, tensor: torch.Tensor, name: str, file: Path
) -> int:
    """Copy `tensor` into `param` (slice `idx` of a fused module, or whole); returns the number of slices a whole
    fused tensor filled (Phi-3's qkv_proj: 3), else 0."""
    mod = _module_of(model, pname)
    dst = param.data
    whole = 0
    if isinstance(mod, FusedLinear) and idx is not None:
        dst = mod.slice_view(param, idx)
    elif isinstance(mod, FusedLinear) and len(mod.slice_sizes) > 1:
        if not model.config.fused_checkpoint:
            raise ModelError(f"{file.name}: tensor {name} maps to fused {pname} without a slice")
        whole = len(mod.slice_sizes)
    if tuple(tensor.shape) != tuple(dst.shape):
        raise ModelError(
            f"{file}: tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}",
            hint="the checkpoint does not match its config.json",
        )
    dst.copy_(tensor)
    return whole


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights in place, drawn on the model's device: matrices ~ N(0, std^2) (HF's initializer_range),
    norm weights 1, biases 0. Deterministic for a seed and device; values only need to keep activations finite."""
    gen = None
    for name, p in model.named_parameters():
        if gen is None:
            gen = torch.Generator(device=p.device).manual_seed(seed)
        if p.dim() >= 2:
            p.normal_(0.0, std, generator=gen)
        elif name.endswith("bias"):
            p.zero_()
        else:  # RMSNorm weights
            p.fill_(1.0)
    for m in model.modules():
        if isinstance(m, GemmaRMSNorm):  # its weight is an offset: 0 is the identity scale
            m.weight.zero_()
