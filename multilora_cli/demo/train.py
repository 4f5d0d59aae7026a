"""Seeded training loops for the demo: the base model on the mixed corpus, then one LoRA per domain.

Documents are packed into one token stream; each training window starts at a document start (a bos), as
inference does. Everything random draws from explicit `torch.Generator`s, so a build is reproducible.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multilora_cli.demo.tinyllama import LoraParams, forward
from multilora_cli.models.config import ATTN_MODULES


@dataclass(slots=True)
class TrainLog:
    """What a training run did: losses averaged over its first and last 10% of steps."""

    steps: int
    first_loss: float
    last_loss: float
    seconds: float


class Batches:
    """Random windows [batch, seq_len + 1] over packed documents (lists of token ids), each at a doc start."""

    def __init__(self, docs: list[list[int]], batch: int, seq_len: int, seed: int):
        stream, starts = [], []
        for d in docs:
            starts.append(len(stream))
            stream.extend(d)
        stream.extend(stream[: seq_len + 1])  # wrap around so every start has a full window
        self.stream = torch.tensor(stream, dtype=torch.long)
        self.starts = torch.tensor(starts, dtype=torch.long)
        self.batch, self.seq_len = batch, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        pick = self.starts[torch.randint(len(self.starts), (self.batch,), generator=self.gen)]
        idx = pick[:, None] + torch.arange(self.seq_len + 1)[None, :]  # [B, T+1]
        return self.stream[idx]


def _fit(params: list[torch.Tensor], loss_fn, batches: Batches, steps: int, lr: float) -> TrainLog:
    """AdamW with 10% warmup and cosine decay to lr/10; gradient norm clipped at 1."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    warm = max(1, steps // 10)
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        if step < warm:
            frac = (step + 1) / warm
        else:
            frac = 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for g in opt.param_groups:
            g["lr"] = lr * frac
        ids = batches.next()
        loss = loss_fn(ids[:, :-1], ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
    k = max(1, steps // 10)
    return TrainLog(steps, sum(losses[:k]) / k, sum(losses[-k:]) / k, time.perf_counter() - t0)


def train_base(w: dict[str, torch.Tensor], cfg: dict, batches: Batches, steps: int, lr: float) -> TrainLog:
    """Train every base weight in place (next-token cross-entropy)."""
    params = list(w.values())
    for p in params:
        p.requires_grad_(True)

    def loss_fn(x, y):
        logits = forward(w, cfg, x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    log = _fit(params, loss_fn, batches, steps, lr)
    for p in params:
        p.requires_grad_(False)
    return log


def module_path(layer: int, module: str) -> str:
    """HF module path of a PEFT module name in decoder layer `layer`: q_proj -> model.layers.0.self_attn.q_proj."""
    block = "self_attn" if module in ATTN_MODULES else "mlp"
    return f"model.layers.{layer}.{block}.{module}"


def train_lora(
    w: dict[str, torch.Tensor],
    cfg: dict,
    targets: list[str],
    r: int,
    scaling: float,
    batches: Batches,
    steps: int,
    lr: float,
    seed: int,
) -> tuple[LoraParams, TrainLog]:
    """Train a LoRA of rank `r` on `targets` (PEFT names) of every layer; the base stays frozen.

    Init as PEFT does: A uniform in ±1/sqrt(in), B zero (so training starts from the base model)."""
    gen = torch.Generator().manual_seed(seed)
    lora: LoraParams = {}
    for layer in range(cfg["num_hidden_layers"]):
        for m in targets:
            name = module_path(layer, m)
            out_f, in_f = w[name + ".weight"].shape
            a = ((torch.rand(r, in_f, generator=gen) * 2 - 1) / math.sqrt(in_f)).requires_grad_(True)
            b = torch.zeros(out_f, r).requires_grad_(True)
            lora[name] = (a, b, scaling)
    params = [t for a, b, _ in lora.values() for t in (a, b)]

    def loss_fn(x, y):
        logits = forward(w, cfg, x, lora)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    log = _fit(params, loss_fn, batches, steps, lr)
    lora = {k: (a.detach(), b.detach(), s) for k, (a, b, s) in lora.items()}
    return lora, log


@torch.no_grad()
def greedy(
    w: dict[str, torch.Tensor], cfg: dict, ids: list[int], n: int, eos: set[int], lora: LoraParams | None = None
) -> list[int]:
    """Greedy continuation (no KV cache; the demo model is tiny). Used for the build's sanity check."""
    out = list(ids)
    for _ in range(n):
        nxt = int(forward(w, cfg, torch.tensor([out]), lora)[0, -1].argmax())
        out.append(nxt)
        if nxt in eos:
            break
    return out[len(ids) :]
