"""Paged decode attention alone (kernels/paged_attention.py) against its bytes floor, over launch settings.

    python -m benchmarks.bench_attention --out $OUT/attention-h200.json

Llama-3-8B attention (32 query heads, 8 kv heads, head dim 128), bf16, 16-token pages scattered at random over
the cache (as a long-running engine leaves them). Cases: the e2e decode step (256 or 64 sequences, context
lengths uniform in [129, 256], as 128-token prompts decoding 128 tokens have) and one long-context case that
takes the split (flash-decoding) path. Each arm (block_n, num_warps, num_stages) is timed as the median of
CUDA-graph replays over 3 copies of the cache (other pages, other q), interleaved and repeated, min taken; the
floor is the K and V bytes of every context token (+ q and out) over the copy bandwidth measured here. Every
arm's output is checked against the table's.
"""

from __future__ import annotations

import itertools
import json
import time

import torch

from benchmarks.timing import copy_bandwidth, device_header, graph_time_us, ints, parser, save_report
from multilora_cli.kernels.paged_attention import paged_attention_decode

H, KVH, D, PAGE = 32, 8, 128, 16
COPIES = 3
DT = torch.bfloat16


class Case:
    """head_major: the cache is stored [block, kv head, page, D] (a kv head's page is one contiguous 4 KB run) and
    passed as a permuted [block, page, kv head, D] view: the kernel addresses it through strides, unchanged."""

    def __init__(self, b: int, lo: int, hi: int, seed: int, head_major: bool = False):
        g = torch.Generator().manual_seed(seed)
        self.b = b
        self.lens = torch.randint(lo, hi + 1, (b,), generator=g, dtype=torch.int32)
        self.max_len = int(self.lens.max())
        pages = -(-self.max_len // PAGE)
        self.copies = []
        for _ in range(COPIES):
            n_blocks = b * pages
            if head_major:
                k = torch.randn(n_blocks, KVH, PAGE, D, device="cuda", dtype=DT).permute(0, 2, 1, 3)
                v = torch.randn(n_blocks, KVH, PAGE, D, device="cuda", dtype=DT).permute(0, 2, 1, 3)
            else:
                k = torch.randn(n_blocks, PAGE, KVH, D, device="cuda", dtype=DT)
                v = torch.randn(n_blocks, PAGE, KVH, D, device="cuda", dtype=DT)
            tables = torch.randperm(n_blocks, generator=g).view(b, pages).to(torch.int32).cuda()
            q = torch.randn(b, H, D, device="cuda", dtype=DT)
            self.copies.append((q, k, v, tables, self.lens.cuda(), torch.empty_like(q)))

    def run(self, i: int, **kw) -> torch.Tensor:
        q, k, v, tables, lens, out = self.copies[i]
        return paged_attention_decode(q, k, v, tables, lens, D**-0.5, max_context_len=self.max_len, out=out, **kw)

    def floor_bytes(self) -> int:
        return int(self.lens.sum()) * KVH * D * 2 * 2 + 2 * self.b * H * D * 2


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--cases", default="256,129,256;64,129,256;16,4000,4096")
    p.add_argument("--block-n", default="16,32,64,128")
    p.add_argument("--warps", default="2,4,8")
    p.add_argument("--stages", default="1,2,3,4")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--head-major", action="store_true", help="cache stored [block, kv head, page, D] (see Case)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    start = time.time()
    bw = copy_bandwidth()
    report = dict(
        **device_header("benchmarks.bench_attention", bw),
        layout="head-major" if args.head_major else "page-major",
        shapes=dict(heads=H, kv_heads=KVH, head_dim=D, page=PAGE),
        rows=[],
    )
    arms = [
        dict(block_n=n, num_warps=w, num_stages=s)
        for n, w, s in itertools.product(ints(args.block_n), ints(args.warps), ints(args.stages))
    ]
    for ci, spec in enumerate(args.cases.split(";")):
        b, lo, hi = ints(spec)
        case = Case(b, lo, hi, seed=ci, head_major=args.head_major)
        ref = case.run(0).float().clone()
        times, ok = {}, {}
        for _ in range(args.repeats):
            for arm in arms:
                key = "n{block_n}w{num_warps}s{num_stages}".format(**arm)
                try:
                    if key not in ok:
                        ok[key] = torch.allclose(case.run(0, **arm).float(), ref, atol=2e-2, rtol=2e-2)
                    fn = lambda i, arm=arm, case=case: case.run(i, **arm)  # noqa: E731
                    times.setdefault(key, []).append(graph_time_us(fn, COPIES, 40))
                except Exception as e:  # noqa: BLE001 - an arm that does not compile (shared memory) is skipped
                    print(f"{key}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                    ok[key] = False
        table = graph_time_us(case.run, COPIES, 40)
        best = min(times, key=lambda k: min(times[k]))
        floor = case.floor_bytes() / bw * 1e6
        row = dict(
            seqs=b,
            context=[lo, hi],
            context_tokens=int(case.lens.sum()),
            floor_us=round(floor, 2),
            table_us=round(table, 2),
            best=best,
            best_us=round(min(times[best]), 2),
            table_over_floor=round(table / floor, 3),
            best_over_floor=round(min(times[best]) / floor, 3),
            all_close=all(ok.values()),
            arms={k: round(min(v), 2) for k, v in times.items()},
        )
        report["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "arms"}), flush=True)
        print(" ".join(f"{k}={v}" for k, v in sorted(row["arms"].items(), key=lambda kv: kv[1])[:12]), flush=True)
        del case
    save_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
