"""The decode roofline: bytes a decode step must read (base weights + live KV + distinct adapters) over the
memory bandwidth measured on the same device, in the same run.

At large decode batches the weight matmuls stop being memory-bound (Llama-3-8B at 256 tokens: ~3.8 TFLOP
per step, ~5 ms at an H200's measured bf16 rate), so the report also gives the compute floor (matmul FLOPs
over the measured matmul rate) and `floor` = max(bytes time, FLOPs time)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.models.config import ModelConfig
from multilora_cli.models.quantization import base_bytes


def measure_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-memory bandwidth in bytes/s from a large copy, counting bytes read plus bytes written (median).

    CUDA: a 1 GiB device-to-device copy timed with events; CPU: a host copy (a stand-in for tests)."""
    n = nbytes // 2
    src = torch.ones(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    times = []
    if device.type == "cuda":
        for _ in range(3):
            dst.copy_(src)
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        import time

        for _ in range(max(3, iters // 4)):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    times.sort()
    return 2 * n * src.element_size() / times[len(times) // 2]


def measure_matmul_flops(device: torch.device, n: int = 8192, iters: int = 10) -> float:
    """bf16 matmul rate in FLOP/s (an n x n x n product on random data, median); CPU: fp32, n = 512."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = n if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    import time

    for i in range(iters + 3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            a @ b
            dt = time.perf_counter() - t0
        if i >= 3:
            times.append(dt)
    times.sort()
    return 2 * n**3 / times[len(times) // 2]


@dataclass(slots=True)
class Roofline:
    """Bytes per decode step of one model + adapter shape; `step_seconds` for a given step.

    MoE bases: a step reads only the experts its tokens route to. With random weights the router spreads tokens
    about uniformly, so T tokens (top-k of E) touch E * (1 - (1 - k/E)^T) distinct experts in expectation, and an
    adapter's T/A tokens (A adapters in the step) that many of its experts' LoRA factors; the FLOP floor counts the
    k active experts per token (not all E)."""

    bandwidth: float  # bytes/s, measured
    weight_bytes: int  # base weights read by every step (all linear layers, norms, the LM head; MoE: no experts)
    kv_bytes_per_token: int  # K+V of one context token, all layers
    adapter_bytes: int  # one adapter's A and B, all layers (MoE: without its expert LoRA)
    flops: float = 0.0  # matmul FLOP/s, measured (0 = no compute floor)
    matmul_params: int = 0  # weights every token multiplies through (linear layers + LM head; MoE: k experts)
    num_experts: int = 0  # MoE: E (0 = dense)
    top_k: int = 0
    expert_bytes: int = 0  # one expert's weights over all sparse layers
    adapter_expert_bytes: int = 0  # one adapter's LoRA of one expert over all sparse layers

    @classmethod
    def for_model(
        cls,
        cfg: ModelConfig,
        dtype_bytes: int,
        adapter_bytes: int,
        bandwidth: float,
        flops: float = 0.0,
        *,
        fp8: bool = False,
        adapter_expert_bytes: int = 0,
    ) -> Roofline:
        """fp8: the decoder projections are read at 1 byte each (models/quantization.base_bytes); the FLOP floor
        stays the bf16 rate's (a conservative floor for FP8 tensor cores). adapter_expert_bytes: the part of
        adapter_bytes that is expert LoRA (all experts, all layers; MoE only)."""
        # embeddings: a step reads only its T rows; the LM head is read whole (tied or not)
        emb = cfg.vocab_size * cfg.hidden_size
        params = cfg.num_params() - (0 if cfg.tie_word_embeddings else emb)
        weight_bytes = base_bytes(cfg, dtype_bytes, fp8) - (0 if cfg.tie_word_embeddings else emb * dtype_bytes)
        moe = dict(num_experts=0, top_k=0, expert_bytes=0, adapter_expert_bytes=0)
        if cfg.moe is not None:
            E, k = cfg.moe.num_experts, cfg.moe.top_k
            per_expert = 3 * cfg.hidden_size * cfg.moe.intermediate_size * len(cfg.moe.sparse_layers)
            weight_bytes -= E * per_expert * dtype_bytes
            params -= (E - k) * per_expert
            adapter_bytes -= adapter_expert_bytes
            moe = dict(
                num_experts=E,
                top_k=k,
                expert_bytes=per_expert * dtype_bytes,
                adapter_expert_bytes=adapter_expert_bytes // E,
            )
        return cls(
            bandwidth=bandwidth,
            weight_bytes=weight_bytes,
            kv_bytes_per_token=cfg.kv_bytes_per_token(dtype_bytes),
            adapter_bytes=adapter_bytes,
            flops=flops,
            matmul_params=params,
            **moe,
        )

    def step_flops(self, tokens: int, kv_tokens: int = 0) -> float:
        """Matmul FLOPs of a decode step: 2 per weight per token (attention's q.k and p.v: 4 per head-dim per
        context token per query head; small at these lengths and left out)."""
        return 2.0 * self.matmul_params * tokens

    def floor_seconds(self, tokens: int, kv_tokens: int, adapters: int) -> float:
        """max(bytes / bandwidth, FLOPs / matmul rate)."""
        mem = self.step_seconds(kv_tokens, adapters, tokens)
        return max(mem, self.step_flops(tokens) / self.flops) if self.flops > 0 else mem

    def touched_experts(self, tokens: float) -> float:
        """Expected distinct experts `tokens` tokens route to (uniform routing), 0 on a dense base."""
        if not self.num_experts or tokens <= 0:
            return 0.0
        return self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** tokens)

    def step_parts(self, kv_tokens: int, adapters: int, tokens: int = 0) -> dict[str, float]:
        """The step's bytes by what reads them: weights (every step: attention, norms, LM head; dense: all),
        experts (MoE: the touched experts), adapters (their non-expert LoRA), expert_lora (each adapter's LoRA of
        the experts its tokens touch), kv (the live context)."""
        parts = dict(
            weights=float(self.weight_bytes),
            experts=0.0,
            adapters=float(adapters * self.adapter_bytes),
            expert_lora=0.0,
            kv=float(kv_tokens * self.kv_bytes_per_token),
        )
        if self.num_experts:
            parts["experts"] = self.touched_experts(tokens) * self.expert_bytes
            if adapters:
                parts["expert_lora"] = adapters * self.touched_experts(tokens / adapters) * self.adapter_expert_bytes
        return parts

    def step_bytes(self, kv_tokens: int, adapters: int, tokens: int = 0) -> float:
        """tokens: the step's tokens (MoE: which experts it reads; ignored on a dense base)."""
        return sum(self.step_parts(kv_tokens, adapters, tokens).values())

    def step_seconds(self, kv_tokens: int, adapters: int, tokens: int = 0) -> float:
        return self.step_bytes(kv_tokens, adapters, tokens) / self.bandwidth
