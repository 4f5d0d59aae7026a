"""`LoRALinear`: a fused linear layer plus stacked adapter slots; forward = base + per-token LoRA delta."""

from __future__ import annotations

import torch

from multilora_cli import kernels
from multilora_cli.kernels.fp8 import Fp8Scheme
from multilora_cli.layers.context import get_context
from multilora_cli.layers.linear import FusedLinear


class LoRALinear(FusedLinear):
    """A `FusedLinear` that also owns `self.lora: kernels.LoraWeights` (one slice per packed projection).

    forward(x [T, in]) = x W^T (+ b), then `kernels.add_lora` adds each token's adapter delta using the
    step's `LoraMeta` (tokens of slot -1 get the base output only). Slots are filled with
    `module.lora.set_slot(slot, slices)` and forgotten with `module.lora.clear_slot(slot)`.
    The slot tensors live on the device the module was built on (build the model on its device).
    """

    def __init__(
        self,
        in_features: int,
        slice_sizes: list[int] | tuple[int, ...],
        bias: bool = False,
        *,
        max_loras: int,
        max_rank: int,
        fp8: Fp8Scheme | None = None,
    ):
        super().__init__(in_features, slice_sizes, bias, fp8)
        self.lora = kernels.LoraWeights.empty(
            max_loras,
            max_rank,
            in_features,
            list(self.slice_sizes),
            dtype=self.compute_dtype,
            device=self.weight.device,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_forward(x)  # [T, out] (FP8 bases too: the delta reads x and adds into y, both bf16)
        ctx = get_context()
        # Eager steps without adapted tokens skip the call; static (CUDA-graph) metadata always calls, since
        # the captured graph must contain the kernels whatever the batch at capture time was.
        if ctx is not None and ctx.lora is not None and (ctx.lora.segments or getattr(ctx.lora, "static", False)):
            kernels.add_lora(y, x, self.lora, ctx.lora)
            if self.lora.dora is not None:  # DoRA rows: g ⊙ (x Wᵀ + delta) (+ b); other rows times exactly 1
                kernels.apply_dora(y, self.lora, ctx.lora, self.bias)
        return y

    def forward_silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this [gate | up] layer's output with each token's LoRA delta: [T, I]. With adapted
        tokens (or graph metadata) the delta and the activation are one kernel (kernels.add_lora_silu_mul), so
        the [T, 2I] output is read once and never rewritten. For the fused-elementwise path (CUDA). With DoRA in
        the run the kernel scales gate and up by the slot's DoRA rows before the activation (with an MLP bias:
        the unfused path, forward then silu_mul)."""
        ctx = get_context()
        if self.lora.dora is not None and self.bias is not None:  # the fused kernel scales without a bias term
            from multilora_cli.kernels import norm_rope

            return norm_rope.silu_mul(self.forward(x))
        y = self.base_forward(x)  # [T, 2I]
        if ctx is not None and ctx.lora is not None and (ctx.lora.segments or getattr(ctx.lora, "static", False)):
            return kernels.add_lora_silu_mul(y, x, self.lora, ctx.lora)
        from multilora_cli.kernels import norm_rope  # triton: imported only on this (CUDA) path

        return norm_rope.silu_mul(y)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_loras={self.lora.max_loras}, max_rank={self.lora.max_rank}"
