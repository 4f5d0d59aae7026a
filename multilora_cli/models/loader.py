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
from multilora_cli.kernels.fp8 import DEFAULT_SMALL_M
from multilora_cli.models.config import FUSED, ModelConfig
from multilora_cli.models.dummy_weights import init_dummy_weights
from multilora_cli.models.llama import LlamaForCausalLM
from multilora_cli.models.moe_names import expert_target, parts_per_param, rename
from multilora_cli.models.quantization import Fp8Format
from multilora_cli.models.weight_copy import copy_expert, copy_into, num_slices, unreadable

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
            raise unreadable(single, e) from None
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise ModelError(
            f"{path}: only PyTorch .bin weights found",
            hint="multilora reads safetensors; re-save with transformers save_pretrained()",
        )
    raise ModelError(f"{path}: no model.safetensors or model.safetensors.index.json")


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
    todo = {(n, i) for n, p in params.items() for i in range(num_slices(model, n))}
    experts_done: dict[str, set] = {}  # 3D expert parameter -> {(expert, part)} loaded from per-expert tensors
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    with torch.no_grad():
        for file, names in sorted(by_file.items()):
            try:
                f = safe_open(file, framework="pt")
            except Exception as e:  # noqa: BLE001 - SafetensorError (truncated, not safetensors), OSError
                raise unreadable(file, e) from None
            with f:
                for name in names:
                    hit = expert_target(name) if config.moe is not None else None
                    if hit is not None and hit[0] in params:
                        copy_expert(params[hit[0]], hit, f, name, file)
                        experts_done.setdefault(hit[0], set()).add(hit[1:])
                        continue
                    pname, idx = _target(rename(name) if config.moe is not None else name)
                    if pname not in params:
                        # inv_freq buffers, a tied lm_head, towers of multimodal checkpoints: nothing of ours
                        continue
                    try:
                        tensor = f.get_tensor(name)
                    except Exception as e:  # noqa: BLE001 - a shard's index names a tensor the file lacks, I/O
                        raise unreadable(file, e, name) from None
                    todo.difference_update(
                        copy_into(model, params[pname], pname, idx, tensor, name, file, quantization)
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
