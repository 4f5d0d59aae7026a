"""The sampling and processing kernels go through Triton's real code generator and ptxas for sm_90 (no GPU
needed): every pass mode of both paths, raw bf16 and processed fp32 keys (processed as loaded), the count
levels' and distance counts' packed counters, and the processing
kernel. The interpreter the other CPU tests use accepts code that the compiler refuses (types across branches,
tuples of pointers), so this compiles them in a process without TRITON_INTERPRET."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from multilora_cli.kernels.penalties import _process_kernel
from multilora_cli.kernels.sample import _sample_pass

PTR = dict(rows_ptr="*i64", temp_ptr="*fp32", top_k_ptr="*i64", top_p_ptr="*fp32", min_p_ptr="*fp32", u_ptr="*fp64",
           out_ptr="*i64", pmax_ptr="*fp32", psum_ptr="*fp32", part_k_ptr="*fp32", part_p_ptr="*fp32",
           cval_ptr="*fp32", ctok_ptr="*i32", wval_ptr="*fp32", wtok_ptr="*i32", plan_rows_ptr="*i64", hist_ptr="*i64", counts_ptr="*i32",
           rep_ptr="*fp32", freq_ptr="*fp32", pres_ptr="*fp32", ban_on_ptr="*i64", bias_tok_ptr="*i64",
           bias_val_ptr="*fp32", bias_len_ptr="*i64", ban_tok_ptr="*i64", ban_len_ptr="*i64", out_ptr_="*fp32")
INTS = {"stride_counts", "stride_bias", "stride_ban", "H", "V", "stride_row", "stride_logits", "S", "C", "LEVEL"}


def compile(fn, constexprs, logits="*bf16", out=None):
    sig = {}
    for n in fn.arg_names:
        if n == "logits_ptr":
            sig[n] = logits
        elif n == "out_ptr" and out:
            sig[n] = out
        elif n in PTR:
            sig[n] = PTR[n]
        else:
            sig[n] = "i32" if n in INTS else "constexpr"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


variants = [(process, bits, mode, False) for process, bits in ((0, 16), (1, 32))  # raw; processed as loaded
            for mode in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)]
for process, bits, mode, packed in variants + [(0, 16, 1, True), (1, 32, 1, True), (0, 16, 9, True), (1, 32, 9, True)]:
    kc = 2048 if mode in (5, 6, 7, 8, 9) else 1  # (kernels/sample.CANDIDATES)
    ks = max(1, kc // 8)  # (the small view of the buffer)
    compile(_sample_pass, dict(MODE=mode, WITH_MIN_P=True, PROCESS=process, WITH_COUNTS=process > 0, KEY_BITS=bits,
                               CHUNK=8192, BLOCK=1024, CB=16, KC=kc, TT=max(1, min(kc, 8192 // kc)), KS=ks,
                               TS=max(1, min(ks, 8192 // ks)), NINF16=127, PACKED=packed, WIDE=4 * kc))
compile(_process_kernel, dict(WITH_COUNTS=True, BLOCK=2048), out="*fp32")
print("compiled")
"""


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without its NVIDIA backend")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
