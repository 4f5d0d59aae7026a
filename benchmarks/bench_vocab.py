"""embed_tokens / lm_head adapters: what their per-row work costs, against the same run with plain LoRA adapters.

    python -m benchmarks.bench_vocab                                   # Llama-3-8B shapes, 64 adapters (GPU)
    python -m benchmarks.bench_vocab --preset tiny --adapters 4 --requests 16 --prompt-len 16 --output-len 8  # CPU

The same workload (`--requests` greedy requests of `--prompt-len` + `--output-len` tokens over `--adapters`
synthetic rank-`--rank` adapters on all 7 projections, uniform) runs in one process on three engines, one after
the other, each warmed up first:
  plain:     the adapters as they are (the baseline);
  vocab_lora: every adapter also has LoRA on embed_tokens and on lm_head at the same rank (layers/vocab_lora.py:
             the embedding delta inside the decode graphs, the head's SGMV on the logits of every step);
  head_copy: `--copies` of the adapters also carry a modules_to_save lm_head [V, H] (a per-row GEMM over V for
             their rows; one copy per slot that holds such an adapter).
Reported: generated tokens/s of each and the ratios vocab_lora / plain and head_copy / plain (read: how much the
extra per-row work costs; target >= 0.9x for vocab_lora at Llama-3-8B shapes). Writes
benchmarks/results/vocab-<device>.json.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.timing import engine_workload_args, parser, report_start, write_report

VOCAB_LORA_TARGET = 0.9


def vocab_weights(cfg, rank: int, i: int, *, lora: bool, copy: bool, dtype: torch.dtype, device: torch.device):
    """Random embed_tokens / lm_head LoRA (A ~ N(0, 1/in), B small, as the synthetic adapters draw theirs) and /
    or an lm_head copy (random N(0, 0.02), like the dummy base), drawn on `device`, kept in host memory."""
    from multilora_cli.adapters.peft import LoraModule
    from multilora_cli.adapters.vocab import VocabWeights

    g = torch.Generator(device=device).manual_seed(1000 + i)
    v, h = cfg.vocab_size, cfg.hidden_size

    def rnd(*shape, std):
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype).cpu()

    out = VocabWeights()
    if lora:
        out.embed = LoraModule(a=rnd(rank, v, std=1.0), b=rnd(h, rank, std=0.002), scaling=2.0)
        out.head = LoraModule(a=rnd(rank, h, std=h**-0.5), b=rnd(v, rank, std=0.05), scaling=2.0)
    if copy:
        out.head_full = rnd(v, h, std=0.02)
    return out


def make_engine(econf, source, cfg, *, lora: bool, copies: int, dtype: torch.dtype):
    """A SyntheticEngine whose adapters carry the arm's vocab modules (copies: the first `copies` adapters), drawn
    here, before the engine exists, so that no timed load draws them."""
    from multilora_cli.bench.adapters import SyntheticEngine

    names = source.names
    device = torch.device(econf.device)
    extra = {
        name: vocab_weights(cfg, source.rank, i, lora=lora, copy=i < copies, dtype=dtype, device=device)
        for i, name in enumerate(names)
        if lora or i < copies
    }

    class VocabEngine(SyntheticEngine):
        def _vocab_parts(self) -> dict:
            if not lora and not copies:
                return {}
            n = self.config.max_loras
            return dict(embed_lora=lora, head_lora=lora, head_full=min(copies, n))

        def _load_cpu(self, name: str):
            adapter = self.source.load(name)
            if name in extra:
                adapter = replace(adapter, vocab=extra[name])
            return self._pack(adapter)

    return VocabEngine(econf, source, cfg)


def time_arm(engine, reqs, repeats: int, device) -> dict:
    best = 0.0
    for _ in range(repeats):
        fresh = [replace(r) for r in reqs]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        res = engine.generate_all(fresh)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        bad = [r for r in res if r.error is not None]
        if bad:
            raise RuntimeError(f"{len(bad)} requests failed: {bad[0].error}")
        best = max(best, sum(r.completion_tokens for r in res) / wall)
    return dict(tokens_per_s=best)


def main(argv: list[str] | None = None) -> int:
    from multilora_cli.bench.adapters import SyntheticAdapters
    from multilora_cli.bench.model_dir import write_model_dir
    from multilora_cli.bench.suite import device_info, engine_config
    from multilora_cli.bench.workload import Workload
    from multilora_cli.models.config import ModelConfig

    ap = parser(__doc__)
    engine_workload_args(ap, requests=512)
    ap.add_argument("--copies", type=int, default=4, help="adapters with a modules_to_save lm_head (head_copy arm)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    info = device_info(device)
    report = report_start("benchmarks.bench_vocab", argv, args, info)
    work = Workload(
        preset=args.preset,
        num_adapters=args.adapters,
        rank=args.rank,
        num_requests=args.requests,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        max_num_seqs=args.max_num_seqs,
    )
    arms = {"plain": dict(lora=False, copies=0), "vocab_lora": dict(lora=True, copies=0)}
    if args.copies:
        arms["head_copy"] = dict(lora=False, copies=args.copies)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / args.preset)
        cfg = ModelConfig.from_dir(model_dir)
        econf = engine_config(work, model_dir, device)
        dtype = getattr(torch, econf.dtype)
        source = SyntheticAdapters(cfg, work.adapter_names, work.rank, seed=work.seed)
        source.prepare(dtype, device, write=False)
        reqs = work.requests(cfg.vocab_size)
        for arm, kw in arms.items():
            engine = make_engine(econf, source, cfg, dtype=dtype, **kw)
            try:
                engine.generate_all(reqs[: min(64, len(reqs))])  # warm-up: compile, capture, slot loads
                report[arm] = time_arm(engine, reqs, args.repeats, device)
            finally:
                engine.close()
                del engine
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            print(f"{arm}: {report[arm]['tokens_per_s']:,.0f} tok/s")
    base = report["plain"]["tokens_per_s"]
    report["ratios"] = {arm: report[arm]["tokens_per_s"] / base for arm in arms if arm != "plain"}
    report["target"] = {"vocab_lora": VOCAB_LORA_TARGET}
    for arm, r in report["ratios"].items():
        print(f"{arm} / plain: {r:.3f}x")
    write_report(report, args.out, "vocab", info["name"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
