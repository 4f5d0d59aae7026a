"""Random weights of real shapes (`load_format` "dummy": benchmarks and sizing from config.json alone, no
checkpoint read), drawn on the model's device and deterministic for a seed and device."""

from __future__ import annotations

import torch

from multilora_cli.kernels import fp8 as fp8_kernels
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.layers.norm import GemmaRMSNorm


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
