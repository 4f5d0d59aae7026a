"""Registers, spills and instruction counts of the sampling kernel's passes as ptxas builds them for sm_90, no GPU
needed (Triton's code generator, ptxas and cuobjdump from its NVIDIA backend):

    python -m benchmarks.sampler_sass                      # every MODE of the raw and processed kernels
    python -m benchmarks.sampler_sass --modes 5,6,7,8,9     # the top-k path's passes
    python -m benchmarks.sampler_sass --modes 1,7 --sass $OUT/sass   # some modes; SASS text per variant kept

Each variant is compiled as a real launch at Llama-3's vocabulary specialises it (pointers and the row stride,
V, S, C divisible by 16: vectorised loads; kernels/sample.py's launch constants), so the numbers are those the
GPU runs: `regs` per thread (occupancy: 65536 / (regs x 128) programs of 4 warps an SM), `stack` / `local` (bytes
of stack, local loads and stores in the SASS: spills), `instrs` (SASS instructions, all paths). PROCESS 0: raw
logits (16-bit keys); 1: processed as loaded (32-bit keys).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

from benchmarks.timing import ints, parser

PTRS = dict(
    rows_ptr="*i64", temp_ptr="*fp32", top_k_ptr="*i64", top_p_ptr="*fp32", min_p_ptr="*fp32", u_ptr="*fp64",
    out_ptr="*i64", pmax_ptr="*fp32", psum_ptr="*fp32", part_k_ptr="*fp32", part_p_ptr="*fp32", cval_ptr="*fp32",
    ctok_ptr="*i32", wval_ptr="*fp32", wtok_ptr="*i32", plan_rows_ptr="*i64", hist_ptr="*i64", counts_ptr="*i32", rep_ptr="*fp32", freq_ptr="*fp32",
    pres_ptr="*fp32", ban_on_ptr="*i64", bias_tok_ptr="*i64", bias_val_ptr="*fp32", bias_len_ptr="*i64",
    ban_tok_ptr="*i64", ban_len_ptr="*i64",
)  # fmt: skip
DIVISIBLE = {"stride_row", "V", "S", "C", "stride_counts", "stride_bias", "stride_ban"}  # (at V = 128256, S = 256)
INTS = DIVISIBLE | {"H", "LEVEL"}


def compile_variant(constexprs: dict, logits: str = "*bf16", num_warps: int = 4) -> tuple[dict, str]:
    """(resource usage, SASS text) of kernels/sample._sample_pass with `constexprs`, built for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from multilora_cli.kernels.sample import _sample_pass

    sig, attrs = {}, {}
    for j, name in enumerate(_sample_pass.arg_names):
        sig[name] = logits if name == "logits_ptr" else PTRS.get(name, "i32" if name in INTS else "constexpr")
        if sig[name].startswith("*") or name in DIVISIBLE:
            attrs[(j,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=_sample_pass, signature=sig, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([f"{tools}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([f"{tools}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    return dict(
        regs=int(re.search(r"REG:(\d+)", res).group(1)),
        stack=int(re.search(r"STACK:(\d+)", res).group(1)),
        local=sum(("LDL" in line or "STL" in line) for line in lines),
        instrs=len(lines),
    ), sass


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--modes", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--sass", default=None, help="folder to write each variant's SASS into")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    for process, bits in ((0, 16), (1, 32)):
        for mode in ints(args.modes):
            for packed in (False, True) if mode in (1, 9) else (False,):
                kc = 2048 if mode in (5, 6, 7, 8, 9) else 1  # (the top-k path's candidate buffer: CANDIDATES)
                ks = max(1, kc // 8)
                consts = dict(
                    MODE=mode, WITH_MIN_P=True, PROCESS=process, WITH_COUNTS=process > 0, KEY_BITS=bits, CHUNK=8192,
                    BLOCK=1024, CB=16, KC=kc, WIDE=4 * kc, TT=max(1, min(kc, 8192 // kc)), KS=ks,
                    TS=max(1, min(ks, 8192 // ks)), NINF16=127, PACKED=packed,
                )  # fmt: skip
                usage, sass = compile_variant(consts)
                row = dict(process=process, mode=mode, packed=packed, **usage)
                print(json.dumps(row), flush=True)
                if args.sass:
                    os.makedirs(args.sass, exist_ok=True)
                    name = f"p{process}_m{mode}{'_packed' if packed else ''}.sass"
                    with open(os.path.join(args.sass, name), "w") as f:
                        f.write(sass)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
