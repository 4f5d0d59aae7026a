"""The flash-attention inner step shared by the paged decode and prefill kernels (log2-domain softmax)."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def logit_scales(scale: float, softcap: float | None) -> tuple[float, float]:
    """(qk_scale, cap_scale) for `online_softmax_step`: without soft-capping the score is q.k * scale * log2(e);
    with it (Gemma 2) tanh(q.k * scale / cap) * cap * log2(e)."""
    if softcap:
        return scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0


@triton.jit
def tanh_f32(x):
    """tanh in float32 from exp2 (the interpreter has no libdevice): sign(x) (1 - e) / (1 + e), e = exp(-2|x|);
    absolute error ~1e-7, so a capped logit is off by ~cap * 1e-7."""
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 * log2(e)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def online_softmax_step(
    q, k, v, visible, qk_scale, cap_scale, m_i, l_i, acc, IEEE: tl.constexpr, SOFTCAP: tl.constexpr
):
    """Fold one key/value tile into running softmax state.

    q: [R, D] queries; k, v: [N, D] the tile; visible: [R, N] (or broadcastable) which keys each row may see;
    qk_scale, cap_scale: from `logit_scales` (the score in the log2 domain is q.k * qk_scale, or with SOFTCAP
    tanh(q.k * qk_scale) * cap_scale). State per row (fp32): m_i [R] running max (log2 domain), l_i [R]
    denominator, acc [R, D] unnormalised numerator. Returns the updated (m_i, l_i, acc). Rows that have seen
    no visible key yet keep m_i = -inf and contribute nothing (no NaN from -inf - -inf).
    """
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if SOFTCAP:
        s = tanh_f32(s * qk_scale) * cap_scale
    else:
        s = s * qk_scale
    s = tl.where(visible, s, float("-inf"))  # [R, N]
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


__all__ = ["LOG2E", "logit_scales", "online_softmax_step", "tanh_f32"]
