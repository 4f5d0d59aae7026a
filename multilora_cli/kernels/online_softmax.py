"""The flash-attention inner step shared by the paged decode and prefill kernels (log2-domain softmax)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(q, k, v, visible, scale_log2, m_i, l_i, acc, IEEE: tl.constexpr):
    """Fold one key/value tile into running softmax state.

    q: [R, D] queries; k, v: [N, D] the tile; visible: [R, N] (or broadcastable) which keys each row may see;
    scale_log2: softmax scale * log2(e). State per row (fp32): m_i [R] running max (log2 domain), l_i [R]
    denominator, acc [R, D] unnormalised numerator. Returns the updated (m_i, l_i, acc). Rows that have seen
    no visible key yet keep m_i = -inf and contribute nothing (no NaN from -inf - -inf).
    """
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(visible, s * scale_log2, float("-inf"))  # [R, N]
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


__all__ = ["online_softmax_step"]
