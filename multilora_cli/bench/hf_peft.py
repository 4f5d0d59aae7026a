"""The baseline users would otherwise run: HF transformers + PEFT `generate(..., adapter_names=[...])`.

Same random-weight shape and synthetic adapters (rank r on all seven projections), same prompts and adapter
assignment as the multilora rows. PEFT's mixed-adapter batches loop over the distinct adapters of the batch in
every LoRA layer, so a decode step is slow; to bound device time each batch size is timed twice with a few
new tokens (n1 < n2), and the per-step time (t2 - t1) / (n2 - n1) plus the prefill t1 - (n1 - 1) * step are
extrapolated to the workload's output length. The report says so.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from multilora_cli.bench.workload import Workload
from multilora_cli.models.config import ModelConfig


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_hf_peft(model_dir: Path, work: Workload, device: torch.device, dtype: torch.dtype):
    """Random-weight HF model of the preset's config with `work.num_adapters` PEFT adapters (init: random A, B)."""
    import peft
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    names = work.adapter_names
    if not names:
        return model
    lcfg = peft.LoraConfig(
        r=work.rank,
        lora_alpha=2 * work.rank,
        target_modules=list(ModelConfig.from_dir(model_dir).peft_modules),
        lora_dropout=0.0,
        init_lora_weights=False,
    )
    with torch.device(device):
        pm = peft.get_peft_model(model, lcfg, adapter_name=names[0])
        for n in names[1:]:
            pm.add_adapter(n, lcfg)
    for p in pm.parameters():
        p.requires_grad_(False)
    return pm.eval()


def _generate(
    model, ids: torch.Tensor, adapters: list[str] | None, n: int, device: torch.device, work: Workload | None = None
) -> float:
    kw = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
    )
    if work is not None and work.sampled:  # the same sampling as the multilora rows (HF's own RNG)
        kw.update(do_sample=True, temperature=work.temperature, top_p=work.top_p, top_k=0)
    if adapters is not None:
        kw["adapter_names"] = adapters
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**kw)
    _sync(device)
    dt = time.perf_counter() - t0
    if out.shape[1] != ids.shape[1] + n:
        raise RuntimeError(f"HF generate returned {out.shape[1] - ids.shape[1]} new tokens, asked for {n}")
    return dt


def time_hf_peft(
    model,
    work: Workload,
    vocab_size: int,
    device: torch.device,
    batch_sizes: list[int],
    new_tokens: tuple[int, int] = (2, 4),
    log=print,
) -> list[dict]:
    """Per batch size: measured times of n1 and n2 new tokens, the derived step/prefill times and the tokens/s
    extrapolated to `work.output_len` new tokens per request."""
    n1, n2 = new_tokens
    prompts = work.prompts(vocab_size)
    assign = work.assignment()
    names = None if work.num_adapters == 0 else [a if a is not None else "__base__" for a in assign]
    warm = torch.tensor(prompts[:2], device=device)
    _generate(model, warm, names[:2] if names else None, 2, device)
    out = []
    for b in batch_sizes:
        b = min(b, work.num_requests)
        ids = torch.tensor(prompts[:b], device=device)
        sub = names[:b] if names else None
        t1 = _generate(model, ids, sub, n1, device, work)
        t2 = _generate(model, ids, sub, n2, device, work)
        step = max((t2 - t1) / (n2 - n1), 1e-9)
        prefill = max(t1 - (n1 - 1) * step, 0.0)
        total = prefill + (work.output_len - 1) * step
        row = dict(
            batch_size=b,
            new_tokens=[n1, n2],
            seconds=[t1, t2],
            step_ms=step * 1e3,
            prefill_s=prefill,
            distinct_adapters=len(set(sub)) if sub else 0,
            measured_tokens_per_s=b * n2 / t2,
            tokens_per_s=b * work.output_len / total,
        )
        log(
            f"  hf-peft batch {b}: step {row['step_ms']:.1f} ms, prefill {prefill:.2f} s, "
            f"~{row['tokens_per_s']:.0f} tok/s extrapolated to {work.output_len} tokens"
        )
        out.append(row)
    return out
