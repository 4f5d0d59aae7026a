"""Copy one checkpoint tensor into the model's parameters, checked: a slice of a fused module (q/k/v of qkv_proj,
gate/up of gate_up_proj) or a whole parameter (Phi-3's fused checkpoints fill every slice), one expert's rows of a
3D expert parameter, FP8 weights as they are with their scales beside them, or an unquantized weight quantized
per output channel as it is copied (--quantization fp8). Each copy returns the (parameter, slice) pairs it filled,
so the loader can name what the checkpoint lacks; a wrong shape or dtype is a ModelError naming tensor and file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from multilora_cli.errors import ModelError
from multilora_cli.kernels import fp8 as fp8_kernels
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.models.moe_names import expert_view
from multilora_cli.models.quantization import Fp8Format


def unreadable(file: Path, e: Exception, tensor: str | None = None) -> ModelError:
    """The error for a checkpoint file (or one of its tensors) safetensors cannot read."""
    what = f"tensor {tensor} of " if tensor else ""
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return ModelError(
        f"{what}{file}: not a readable safetensors file ({why})",
        hint="the file is truncated or corrupt: download the model again",
    )


def copy_expert(param: torch.Tensor, hit: tuple[str, int, str], f, name: str, file: Path) -> None:
    """Copy one expert's checkpoint tensor into its rows of a 3D expert parameter (models/moe_names.py)."""
    pname, expert, part = hit
    if expert >= param.shape[0]:
        raise ModelError(f"{file}: tensor {name} is expert {expert}, but the config has {param.shape[0]} experts")
    dst = expert_view(param, expert, part)
    try:
        tensor = f.get_tensor(name)
    except Exception as e:  # noqa: BLE001 - a shard's index names a tensor the file lacks, I/O
        raise unreadable(file, e, name) from None
    if tuple(tensor.shape) != tuple(dst.shape):
        raise ModelError(
            f"{file}: tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}",
            hint="the checkpoint does not match its config.json",
        )
    dst.copy_(tensor)


def _module_of(model: torch.nn.Module, pname: str) -> torch.nn.Module:
    return model.get_submodule(pname.rsplit(".", 1)[0]) if "." in pname else model


def num_slices(model: torch.nn.Module, pname: str) -> int:
    """Slices of the parameter `pname`: its fused module's (FusedLinear.slice_sizes), else 1."""
    mod = _module_of(model, pname)
    return len(mod.slice_sizes) if isinstance(mod, FusedLinear) else 1


def copy_into(
    model,
    param: torch.Tensor,
    pname: str,
    idx: int | None,
    tensor: torch.Tensor,
    name: str,
    file: Path,
    quantization: Fp8Format | None = None,
) -> set[tuple[str, int]]:
    """Copy `tensor` into `param` (slice `idx` of a fused module, or whole: Phi-3's qkv_proj fills its 3 slices);
    returns the (parameter, slice) pairs it filled (an online-quantized weight fills its weight_scale too)."""
    mod = _module_of(model, pname)
    slices = [idx or 0]
    if isinstance(mod, FusedLinear) and idx is None and len(mod.slice_sizes) > 1:
        if not model.config.fused_checkpoint:
            raise ModelError(f"{file.name}: tensor {name} maps to fused {pname} without a slice")
        slices = list(range(len(mod.slice_sizes)))
    fp8_mod = isinstance(mod, FusedLinear) and mod.fp8 is not None
    if tensor.dtype == fp8_kernels.FP8 and not (fp8_mod and param is mod.weight):
        raise ModelError(
            f"{file}: tensor {name} is float8_e4m3fn where multilora expects unquantized weights",
            hint="the checkpoint does not match its quantization_config",
        )
    if fp8_mod and param is not mod.weight and param is not mod.bias:
        return _copy_scale(mod, param, pname, idx, slices, tensor, name, file)
    dst = mod.slice_view(param, idx) if isinstance(mod, FusedLinear) and idx is not None else param.data
    if tuple(tensor.shape) != tuple(dst.shape):
        raise ModelError(
            f"{file}: tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}",
            hint="the checkpoint does not match its config.json",
        )
    done = {(pname, i) for i in slices}
    if fp8_mod and param is mod.weight and tensor.dtype != fp8_kernels.FP8:
        if quantization is None or not quantization.online:
            raise ModelError(
                f"{file}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, expected float8_e4m3fn "
                f"(config.json declares {quantization.method if quantization else 'fp8'})",
                hint="the checkpoint does not match its quantization_config",
            )
        wq, scale = fp8_kernels.quantize_rows(tensor.to(dst.device))  # [rows, in] e4m3, [rows] fp32
        dst.copy_(wq)
        scale_name = pname.removesuffix("weight") + "weight_scale"
        (mod.slice_view(mod.weight_scale, idx) if idx is not None else mod.weight_scale.data).copy_(scale)
        return done | {(scale_name, i) for i in slices}
    dst.copy_(tensor)
    return done


def _copy_scale(
    mod: FusedLinear, param, pname: str, idx: int | None, slices: list[int], tensor, name: str, file: Path
) -> set[tuple[str, int]]:
    """weight_scale: one number (per tensor, repeated over the rows it scales) or one per row ([rows] / [rows, 1]);
    input_scale: one number per checkpoint projection."""
    dst = mod.slice_view(param, idx) if idx is not None else param.data
    t = tensor.float()
    if param is mod.input_scale and idx is None and t.numel() == 1:
        dst.fill_(t.item())  # Phi-3's fused projection: one input scale for its slices
    elif t.numel() == 1:
        dst.copy_(t.reshape(()).expand(dst.shape))
    elif param is mod.weight_scale and t.numel() == dst.numel() and t.dim() <= 2 and t.shape[0] == dst.shape[0]:
        dst.copy_(t.reshape(dst.shape))
    else:
        raise ModelError(
            f"{file}: tensor {name} has shape {tuple(tensor.shape)}, expected one scale per tensor or per output "
            f"channel ({dst.shape[0]}, 1)",
            hint="block-wise and other FP8 scale layouts are not served",
        )
    return {(pname, i) for i in slices}
