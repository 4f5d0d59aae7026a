"""The bytes floor of one sparse MoE layer at a step, with expert LoRA, vs what `kernels/fused_moe.py` reads and
launches (benchmarks/bench_moe.py prints it beside the measured times).

    T tokens, top-k K of E experts, S distinct adapters (each token one adapter or the base), rank r, bf16 (2 B)
    expert bytes     eb = 3 * I * H * 2                                  (gate, up, down of one expert)
    LoRA bytes       lb = r * (2H + 2I + I + H) * 2                      (A gate, A up, B gate, B up, A down, B down)
                     PEFT target_parameters on gate_up_proj: one A for gate and up, lb = r * (H + 2I + I + H) * 2
    floor (base)     = distinct experts D * eb
    floor (LoRA)     = distinct (expert, adapter) pairs G * lb           (each touched factor read once)
    uniform routing: D = E * (1 - (1 - K/E)^T), G = S * E * (1 - (1 - K/E)^(T/S))
    e.g. T = 256, S = 16, Qwen3-30B-A3B shapes: D = 128, G ~ 1,300, 1.2 GB + 0.35 GB: LoRA's floor is ~30% of the
    base's, ~90 us a layer at 4 TB/s.

What the kernels read beyond the floor (from the step's actual routing; `bm` rows per block):
    row path (kernels/moe_gemm.py): the gate_up shrink reads A (2r x H) once per (block, adapter in it) at
      16-row blocks, once per (expert, adapter) group at larger ones: ~G; the epilogues gather B and down's A per
      adapted pair and output tile (repeats of a group within a block come from L1/L2, so DRAM sees ~G x their
      bytes): ~the floor
    grouped path (kernels/moe_lora.py): every factor once per (expert, adapter) block, plus the activations
      h [P, 2I] written and read, y [P, H] read and written again
Launches and programs: counted by dry-running the call under kernels/launch.collect (real launches, not a guess);
programs = the static grids (what a CUDA graph replays), of which `busy` have work (the rest exit at once).
"""

from __future__ import annotations

import torch

BYTES = 2  # bf16


def expert_bytes(H: int, inter: int) -> int:
    return 3 * inter * H * BYTES


def lora_bytes(H: int, inter: int, rank: int, shared_a: bool = False) -> int:
    """One adapter's factors of one expert (shared_a: gate and up share one A, read once)."""
    return rank * ((1 if shared_a else 2) * H + 2 * inter + inter + H) * BYTES


def expected_touched(E: int, K: int, tokens: float) -> float:
    """Distinct experts `tokens` tokens route to under uniform routing."""
    return E * (1.0 - (1.0 - K / E) ** tokens) if tokens > 0 else 0.0


def layer_account(
    experts: torch.Tensor, slot: torch.Tensor, E: int, H: int, inter: int, rank: int, bm: int, shared_a: bool = False
) -> dict:
    """Bytes floor and kernel reads of one layer for this routing (experts [T, K]) and slots ([T], -1 = base)."""
    T, K = experts.shape
    P = T * K
    e = experts.reshape(-1).long().cpu()
    s = slot.long().cpu().repeat_interleave(K)
    n_slot = int(s.max()) + 2 if P else 1
    per_expert = torch.bincount(e, minlength=E)
    groups = torch.bincount(e * n_slot + s + 1, minlength=E * n_slot).view(E, n_slot)[:, 1:]  # adapted only
    D = int((per_expert > 0).sum())
    G = int((groups > 0).sum())
    blocks_e = int(((per_expert + bm - 1) // bm).sum())
    blocks_es = int(((groups + bm - 1) // bm).sum())
    adapted = int((s >= 0).sum())
    eb, lb = expert_bytes(H, inter), lora_bytes(H, inter, rank, shared_a)
    shrink_a = (1 if shared_a else 2) * rank * H * BYTES  # gate and up A of one (expert, adapter)
    rest = lb - shrink_a  # the B blocks and down's A / B
    act = BYTES * P
    return dict(
        tokens=T,
        distinct_adapters=int(slot[slot >= 0].unique().numel()),
        distinct_experts=D,
        expert_adapter_pairs=G,
        expert_blocks=blocks_e,
        expert_adapter_blocks=blocks_es,
        floor_base_bytes=D * eb,
        floor_lora_bytes=G * lb,
        row_lora_bytes=G * shrink_a + adapted * rest,  # no L1/L2 reuse of a block's repeats
        row_lora_dram_bytes=G * shrink_a + G * rest,  # repeats within a group from cache (straddles not counted)
        grouped_lora_bytes=blocks_es * lb + act * (2 * 2 * inter + 2 * H),  # + h written and read, y re-read/written
    )
