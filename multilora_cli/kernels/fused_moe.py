"""`fused_moe`: a sparse MoE block's experts with per-token expert LoRA in Triton launches, CUDA-graph safe.

Semantics: exactly `kernels/moe_reference.moe_reference` (its docstring; it is the torch reference the tests
compare against). Shapes (T tokens, K top-k, E experts, hidden H, expert intermediate I, L slots, R max rank):

    x:       [T, H]          fp16 | bf16 | fp32       weights: [T, K] fp32 or x's dtype (routing weights)
    experts: [T, K]          int (distinct per row)   slot:    [T] int, -1 = base (None: no LoRA)
    gate_up: [E, 2I, H]      x's dtype                down:    [E, H, I] x's dtype
    lora:    ExpertLoraWeights in x's dtype (kernels/expert_weights.py: gate|up A/B (B of each over its own rank
             columns), scales per rank column, rank per slot)

    pairs p = t*K + k; two block-aligned orders (kernels/moe_align.py, static shapes, no host sync):
      by expert (the base GEMMs: each expert's weights streamed once per block of up to BM pairs),
      by (expert, slot) (the grouped LoRA launches: one adapter's factors of one expert per block)
    base only:
      act[p] = silu(g) * u,  [g | u] = x[t] @ gate_up[e]^T                          [T*K, I]   (one launch)
      y[p]   = (act[p] @ down[e]^T) * weights[t, k]                                 [T*K, H]   (one launch)
    with LoRA (s = slot[t]; the LoRA terms only where s >= 0 and the slot is not empty):
      sg[p]  = (x[t] @ gu_a[s, e]^T) * gu_scale[s]                                  [T*K, 2R]  (by (expert, slot))
      act[p] = silu(g) * u,  [g | u] = x[t] @ gate_up[e]^T + gate_up_delta(sg[p], gu_b[s, e])   [T*K, I]
      sd[p]  = (act[p] @ dn_a[s, e]^T) * dn_scale[s]                                [T*K, R]
      y[p]   = (act[p] @ down[e]^T + sd[p] @ dn_b[s, e]^T) * weights[t, k]          [T*K, H]
    out[t] = sum over k = 0..K-1 of y[t*K + k]  (fp32 sum in k order, cast to x's dtype)

Two ways to run the LoRA terms, the same numbers up to rounding order (`row_lora`, default: steps up to a prefill
chunk of 8,192 tokens):
  row_lora (T*K <= ROW_LORA_MAX_PAIRS): one alignment (blocks by expert, rows in slot order), one shrink launch
    for gate and up (shared input x; a program per (expert, adapter) of a block, or of the step at prefill sizes:
    each reads its A once), then the two base GEMMs with the rest in their epilogues (kernels/moe_gemm.py), one
    tensor-core dot per distinct adapter of a block (kernels/moe_dots.py): each row gets its own adapter's expand
    before the SiLU-and-mul and before the routing weight, and the gate_up GEMM leaves the down shrink's partials
    per output tile, which one small launch sums (moe_dots.sum_parts). 7 Triton launches vs the base's 5. On
    sm_90+ the shrink, gate_up GEMM, sum_parts and down GEMM are chained with PDL (`row_pdl`): each GEMM runs its
    main loop over inputs written two or more launches back and waits for its predecessor only before the
    epilogue reads the shrink's output; nothing is written before the wait, so the bits are those of plain
    launches (tests/kernels/test_fused_moe_gpu.py).
  grouped (steps past ROW_LORA_MAX_PAIRS: slower than the row path at every size measured up to there; larger
    chunks unmeasured):
    a second alignment by (expert, slot), h = x @ gate_up^T stored, shrink, expand + SiLU-and-mul, down GEMM,
    shrink, expand + weight in place (kernels/moe_lora.py): 12 Triton launches.

Why LoRA is not in the base GEMM's grouping: a decode step of 256 tokens and 16 adapters has ~1,300 (expert,
adapter) groups of ~1.6 pairs; grouping the base GEMM by them would stream each expert's weights once per group,
by expert alone once per 16 pairs. Each row's numbers depend on its own token, expert and slot only (the per-token
sum runs over its K pairs in a fixed order; the alignment's atomics only pick which tile row a pair sits in), so a
row's result does not depend on its neighbours (the interpreter test checks it bit for bit).
Rank-aware: a slot's rank rows past `lora.rank[s]` are masked (no bytes read), an empty slot or slot -1 skips the
LoRA terms. Grids are static given T (padding blocks exit at once): the whole call can be captured in a graph.
Accumulation is fp32 in registers; act, h, sg, sd and y are in x's dtype (where the reference rounds too).
"""

from __future__ import annotations

import torch
import triton

from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.moe_align import align_pairs
from multilora_cli.kernels.moe_dots import sum_parts
from multilora_cli.kernels.moe_gemm import BN, RowLora, expert_gemm
from multilora_cli.kernels.moe_lora import expand, shrink
from multilora_cli.kernels.pdl import OFF, PdlMode, pdl_mode

# H200, Qwen3-30B-A3B shapes: with an expert's rows in slot order and the shrink by (expert, adapter) group, the row
# path is faster up to a prefill chunk of 8,192 tokens (benchmarks/HISTORY.md, session 25)
ROW_LORA_MAX_PAIRS = 65536
# the row path's four LoRA launches chained with PDL up to here (kernels/pdl.py): the gate_up and down GEMMs run
# their main loops while the shrink / sum_parts before them finish, and wait only before their epilogues
PDL_MAX_PAIRS = 65536
# the row path's output tiles (gate_up's BN, down's BN): down's epilogue walks a block's adapters once per tile, and
# 128-wide tiles halve the walks over H; H200, 16 adapters a step, us a layer against 64 x 64: 256 tokens 455 vs
# 462, 1,083 tokens 842 vs 899, 8,192 tokens 2,316 vs 2,490 (gate_up at 128 and down at 256 were slower)
LORA_BN = (BN, 128)


def row_pdl(device: torch.device, num_pairs: int, on: bool | None = None) -> PdlMode:
    """The row path's PDL mode: `on` (None: up to PDL_MAX_PAIRS) where the device can (pdl.pdl_mode: sm_90+, not
    the interpreter, MULTILORA_PDL != 0, pdl.force); launch only (no L2 prefetch)."""
    if not pdl_mode(device, 1).launch:
        return OFF
    return PdlMode(launch=True) if (on if on is not None else num_pairs <= PDL_MAX_PAIRS) else OFF


def block_m_for(num_pairs: int) -> int:
    """Rows per block: 16 (the tensor-core minimum) for decode-sized steps, where most experts get a few pairs;
    64 once there are enough pairs per expert to fill bigger tiles."""
    return 16 if num_pairs <= 4096 else 64


def fused_moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    slot: torch.Tensor | None = None,
    lora: ExpertLoraWeights | None = None,
    block_m: int | None = None,
    row_lora: bool | None = None,
    pdl: bool | None = None,
    lora_bn: tuple[int, int] = LORA_BN,
) -> torch.Tensor:
    """See the module docstring. Returns out [T, H] in x's dtype. row_lora: None = by the step's pair count;
    pdl: the row path's launches chained with PDL (`row_pdl`; None = by the pair count); lora_bn: the row path's
    output tiles (gate_up's, down's; gate_up's also sets the down shrink's partials, one per tile)."""
    T, K = experts.shape
    E, two_i, H = gate_up.shape
    inter = two_i // 2
    if T == 0:
        return torch.zeros_like(x)
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    rw = weights.contiguous().view(-1)  # [T*K]
    P, bm = T * K, block_m or block_m_for(T * K)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32: exact products, not tf32's (as sgmv_*)
    new = lambda *shape: torch.empty(*shape, dtype=x.dtype, device=x.device)  # noqa: E731
    gemm = lambda *a, **kw: expert_gemm(*a, prec=prec, **kw)  # noqa: E731
    if lora is None or slot is None:
        by_e = align_pairs(experts, None, E, 0, bm)
        act = new(P, inter)
        gemm(x, gate_up, by_e, rw, act, K, inter, inter, gather=True, silu=True, weight=False)
        y = new(P, H)
        gemm(act, down, by_e, rw, y, K, H, inter, gather=False, silu=False, weight=True)
        return y.view(T, K, H).sum(dim=1, dtype=torch.float32).to(x.dtype)
    R = lora.max_rank
    sg = new(P, 2 * R)
    if row_lora if row_lora is not None else P <= ROW_LORA_MAX_PAIRS:
        by_e = align_pairs(experts, slot, E, lora.max_loras, bm, by_expert=True)  # one: by expert, in slot order
        chain = row_pdl(x.device, P, pdl)
        shrink(
            x,
            lora.gu_a,
            lora.gu_scale,
            lora.rank,
            lora.shared,
            by_e,
            sg,
            K,
            R,
            gather=True,
            nsl=2,
            prec=prec,
            slot=slot,
            pdl=chain,
        )
        part = torch.empty(triton.cdiv(inter, lora_bn[0]), P, R, dtype=torch.float32, device=x.device)
        act = new(P, inter)
        lo = RowLora(slot, lora.rank, sg, lora.gu_b, lora.dn_a, part, R)
        gemm(
            x, gate_up, by_e, rw, act, K, inter, inter, gather=True, silu=True, weight=False, lora=lo, pdl=chain,
            bn=lora_bn[0],
        )  # fmt: skip
        y = new(P, H)
        sd = new(P, R)
        sum_parts(part, lora.dn_scale, slot, lora.rank, sd, K, R, pdl=chain)
        lo = RowLora(slot, lora.rank, sd, lora.dn_b, None, None, R)
        gemm(
            act, down, by_e, rw, y, K, H, inter, gather=False, silu=False, weight=True, lora=lo, pdl=chain,
            bn=lora_bn[1],
        )  # fmt: skip
        return y.view(T, K, H).sum(dim=1, dtype=torch.float32).to(x.dtype)
    by_e = align_pairs(experts, None, E, 0, bm)
    by_es = align_pairs(experts, slot, E, lora.max_loras, bm)
    shrink(x, lora.gu_a, lora.gu_scale, lora.rank, lora.shared, by_es, sg, K, R, gather=True, nsl=2, prec=prec)
    h = new(P, two_i)
    gemm(x, gate_up, by_e, rw, h, K, two_i, inter, gather=True, silu=False, weight=False)
    act = new(P, inter)
    expand(h, sg, lora.gu_b, lora.rank, by_es, rw, act, inter, R, silu=True, prec=prec)
    y = new(P, H)
    gemm(act, down, by_e, rw, y, K, H, inter, gather=False, silu=False, weight=False)
    sd = new(P, R)
    shrink(act, lora.dn_a, lora.dn_scale, lora.rank, lora.shared, by_es, sd, K, R, gather=False, nsl=1, prec=prec)
    expand(y, sd, lora.dn_b, lora.rank, by_es, rw, y, H, R, silu=False, prec=prec)  # in place, row by row
    return y.view(T, K, H).sum(dim=1, dtype=torch.float32).to(x.dtype)
