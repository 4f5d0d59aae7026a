"""Build a `LlamaForCausalLM` on its device and fill it from Hugging Face safetensors checkpoints.

Reads `model.safetensors` or a sharded `model.safetensors.index.json` through safetensors' mmap, one
tensor at a time (peak host memory ~ one tensor). HF names map onto our fused parameters:
q/k/v_proj -> slices 0/1/2 of qkv_proj, gate/up_proj -> slices 0/1 of gate_up_proj; o_proj and down_proj
are one-slice fused modules. Phi-3 checkpoints hold qkv_proj and gate_up_proj already fused in our row order
(q|k|v, gate|up): they are copied whole. With tied embeddings `lm_head.weight` is absent (or ignored).

FP8 bases (`quantization`, models/quantization.py): the decoder projections are FP8 `FusedLinear`s. An FP8
checkpoint's e4m3 weights are copied as they are, its `weight_scale` (per tensor: repeated over the slice's rows;
per channel: [rows, 1]) and `input_scale` beside them; fbgemm's `input_scale_ub` is config.json's
activation_scale_ub and is not read. `--quantization fp8` (an online format) quantizes each bf16 / fp16 / fp32
projection per output channel as it is read, so host and device never hold more than one unquantized tensor.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import torch

from multilora_cli.errors import ModelError, UnsupportedModelError
from multilora_cli.kernels import fp8 as fp8_kernels
from multilora_cli.kernels.fp8 import DEFAULT_SMALL_M
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.layers.norm import GemmaRMSNorm
from multilora_cli.models.config import FUSED, ModelConfig
from multilora_cli.models.llama import LlamaForCausalLM
from multilora_cli.models.moe_names import expert_target, expert_view, parts_per_param, rename
from multilora_cli.models.quantization import Fp8Format

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
_FUSED_RE = re.compile(r"^(.*\.)(" + "|".join(FUSED) + r")\.(weight|bias|weight_scale|input_scale|input_scale_ub)$")


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
    quantization: Fp8Format | None = None,
    fp8_small_m: int = DEFAULT_SMALL_M,
) -> LlamaForCausalLM:
    """Build the model on `device` in `dtype` and load every weight; raises ModelError naming tensor and file.

    load_format "dummy" reads no checkpoint: weights are random (see `init_dummy_weights`, seeded by `seed`),
    for benchmarks and sizing with real shapes from config.json alone. `quantization`: the FP8 format of the
    decoder projections (the checkpoint's, or the online one of --quantization fp8); None: none. fp8_small_m: the
    token count from which FP8 layers take cuBLAS (kernels/fp8.py).
    """
    if quantization is None and config.quantization is not None:
        quantization = config.quantization  # an FP8 checkpoint is never read as if it were not
    if quantization is not None and config.moe is not None:
        # the experts are 3D parameters outside FusedLinear: FP8 experts would be cast without their scales
        raise UnsupportedModelError(
            f"{path}: FP8 mixture-of-experts bases are not served yet (FP8 is served on dense bases)",
            hint="serve the bf16 checkpoint of this model",
        )
    fp8 = quantization.scheme(fp8_small_m) if quantization is not None else None
    model_kw = {"max_loras": max_loras, "max_lora_rank": max_lora_rank, "lora_targets": lora_targets, "fp8": fp8}
    if load_format == "dummy":
        with torch.device(device), _default_dtype(dtype):
            model = LlamaForCausalLM(config, **model_kw)
        init_dummy_weights(model, seed)
        return model.eval()
    if load_format != "auto":
        raise ModelError(f"unknown load format {load_format!r}", hint="use auto or dummy")
    from safetensors import safe_open

    files = checkpoint_files(path)
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(config, **model_kw)
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
                    todo.difference_update(
                        _copy_into(model, params[pname], pname, idx, tensor, name, file, quantization)
                    )
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


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights in place, drawn on the model's device: matrices ~ N(0, std^2) (HF's initializer_range),
    norm weights 1, biases 0. Deterministic for a seed and device; values only need to keep activations finite."""
    gen = None
    fp8_params = set()
    for m in model.modules():
        if isinstance(m, FusedLinear) and m.fp8 is not None:
            fp8_params |= {id(p) for p in (m.weight, m.weight_scale, m.input_scale) if p is not None}
    for name, p in model.named_parameters():
        if gen is None:
            gen = torch.Generator(device=p.device).manual_seed(seed)
        if id(p) in fp8_params:
            continue
        if p.dim() >= 2:
            p.normal_(0.0, std, generator=gen)
        elif name.endswith("bias"):
            p.zero_()
        else:  # RMSNorm weights
            p.fill_(1.0)
    for m in model.modules():
        if isinstance(m, GemmaRMSNorm):  # its weight is an offset: 0 is the identity scale
            m.weight.zero_()
        if isinstance(m, FusedLinear) and m.fp8 is not None:
            _dummy_fp8(m, gen, std)


def _dummy_fp8(m: FusedLinear, gen: torch.Generator, std: float, rows: int = 4096) -> None:
    """Random FP8 weights drawn `rows` rows at a time in the compute dtype and quantized per channel: a 70B base is
    never materialised in bf16 (one chunk at a time: 4096 x 28672 bf16 = 235 MB at most)."""
    for lo in range(0, m.out_features, rows):
        hi = min(lo + rows, m.out_features)
        w = torch.empty(hi - lo, m.in_features, device=m.weight.device, dtype=m.compute_dtype).normal_(
            0.0, std, generator=gen
        )
        wq, scale = fp8_kernels.quantize_rows(w)
        m.weight.data[lo:hi].copy_(wq)
        m.weight_scale.data[lo:hi].copy_(scale)
    if m.input_scale is not None:
        m.input_scale.data.fill_(1.0 / fp8_kernels.FP8_MAX)  # activations of |x| <= 1 span the e4m3 range
