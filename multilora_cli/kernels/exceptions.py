"""A processed row as its raw logits plus a short list of exceptions, per chunk: what the sampling passes load
instead of processing every logit in every pass (kernels/sample.py, PROCESS 2).

Processing changes few logits of a row: the penalties only those with a count (its prompt and generated tokens),
logit_bias and min_tokens only their listed tokens. Fused into every load (kernels/penalties.process_block), it
cost each pass of the top-k path a 4-byte count read per logit, a division per logit and binary searches over
the bias and ban lists per block (H200, 256 rows x 128k, 6 passes: `all` 912 us against 501 us unprocessed).
Instead, once per step, `build` runs the definition over each chunk and keeps, in vocabulary order, the tokens
whose processed fp32 bits differ from their raw logit's:

    for each chunk (i, c) of [lo, hi), blocks b of BLOCK logits from lo:
        x = process_block(row, ...)                       # the definition, fp32
        exc = [t for t in [lo, hi) if bits(x[t]) != bits(float32(logits[t]))]
        tok[i, c, :len(exc)] = exc;  val[i, c, :len(exc)] = x[exc]     (the first EC of them)
        start[i, c, b] = number of exc entries before block b          (b = 0 .. blocks of the chunk)
        n[i, c] = len(exc)

and every later pass loads (`load`) float32(logits) with val patched in at tok, block by block: the same bits as
process_block wherever n[i, c] <= EC; a chunk with more (thousands of biased tokens, a long history in one
chunk) is processed as it loads, as before. Bitwise, so +-0, -inf and NaN are exact too.
"""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.penalties import process_block


@triton.jit
def build(row, lo, hi, r, P, tok_ptr, val_ptr, start_ptr, n_ptr, EC, WITH_COUNTS: tl.constexpr, BLOCK: tl.constexpr):
    """The exceptions of [lo, hi) of plan row r (P: the plan's process_block arguments) -> tok_ptr[:EC] (int32),
    val_ptr[:EC] (fp32), start_ptr[:blocks + 1] (int32), n_ptr[0] (int32); see the module docstring."""
    pos = tl.zeros((), tl.int32)
    for first in range(lo, hi, BLOCK):
        offs = first + tl.arange(0, BLOCK)
        ok = offs < hi
        x = process_block(
            row, offs, ok, first, r, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], P[10], P[11],
            P[12], P[13], P[14], WITH_COUNTS, BLOCK,
        )  # fmt: skip
        raw = tl.load(row + offs, mask=ok, other=0.0).to(tl.float32)
        diff = ok & (x.to(tl.int32, bitcast=True) != raw.to(tl.int32, bitcast=True))
        tl.store(start_ptr + (first - lo) // BLOCK, pos)
        n = tl.sum(diff.to(tl.int32), axis=0)
        if n > 0:
            at = pos + tl.cumsum(diff.to(tl.int32), axis=0) - 1  # in vocabulary order
            keep = diff & (at < EC)
            tl.store(tok_ptr + at, offs, mask=keep)
            tl.store(val_ptr + at, x, mask=keep)
        pos += n
    tl.store(start_ptr + (hi - lo + BLOCK - 1) // BLOCK, pos)
    tl.store(n_ptr, pos)


@triton.jit
def load(row, offs, ok, first, lo, tok_ptr, val_ptr, start_ptr, TB: tl.constexpr, BLOCK: tl.constexpr):
    """float32(row[offs]) with the chunk's exceptions of this block patched in (offs = first + arange(BLOCK), in
    the chunk that starts at lo; 0 where not ok): the entries start[b] .. start[b + 1] of the table's block b
    (TB logits, as `build` ran; BLOCK <= TB divides it), a few a block."""
    x = tl.load(row + offs, mask=ok, other=0.0).to(tl.float32)
    b = (first - lo) // TB
    for j in range(tl.load(start_ptr + b), tl.load(start_ptr + b + 1)):
        x = tl.where(offs == tl.load(tok_ptr + j), tl.load(val_ptr + j), x)
    return x
