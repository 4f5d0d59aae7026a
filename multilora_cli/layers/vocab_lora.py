"""`VocabAdapters`: per-slot adapters of the vocabulary-sized modules (embed_tokens, lm_head) on the device.

Semantics per token t of slot s = slot(t) >= 0 (tokens of slot -1, the base, are untouched):
    embedding LoRA  e[t] = E[id_t] + s_emb[s] · A_embᵀ[s][id_t, :r] @ B_emb[s][:, :r]ᵀ     (before any embed scale)
    full embedding  e[t] = E_full[f(s)][id_t]           f(s): the copy slot of s's modules_to_save embed_tokens
    lm_head LoRA    logits[t] = h[t] Wᵀ + s_head[s] · (h[t] A_head[s]ᵀ) B_head[s]ᵀ      (before soft-capping)
    full head       logits[t] = h[t] W_full[f(s)]ᵀ
The embedding LoRA's delta is an ordinary SGMV expand: `kernels.add_lora` on u = A_embᵀ[slot, id] [T, R] with an
identity lora_A (the shrink of u by I is u itself), so it runs inside decode CUDA graphs with the step's static
`LoraMeta`, like every other LoRA layer. The full-embedding gather is graph-safe too: `embed_full_of` [L + 1] maps
a slot to its copy (-1: none; index -1 = the base) and is rewritten only by installs. The head runs eagerly after
the forward (the logits are never inside a graph), grouped by the rows' slots.
Full copies live in a pool of `n_full` [V, H] weights per module, taken by an install and given back by an eviction.
"""

from __future__ import annotations

import numpy as np
import torch

from multilora_cli import kernels
from multilora_cli.kernels import LoraMeta, LoraWeights, build_lora_meta


class VocabAdapters:
    """Slots of embed_tokens / lm_head adapters for `max_loras` LoRA slots; each part allocated only when asked
    for (a run whose adapters have no embedding LoRA holds no embedding slots)."""

    def __init__(
        self,
        max_loras: int,
        max_rank: int,
        vocab: int,
        hidden: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        embed_lora: bool = False,
        head_lora: bool = False,
        embed_full: int = 0,
        head_full: int = 0,
    ):
        self.max_loras, self.vocab, self.hidden, self.device = max_loras, vocab, hidden, device
        self.embed = self.embed_at = self.head = None
        if embed_lora:
            # lora_A identity per slot: the expand reads u = A_embᵀ[slot, id] directly (see the module docstring)
            self.embed = LoraWeights.empty(max_loras, max_rank, max_rank, [hidden], dtype=dtype, device=device)
            self.embed.a[:, 0].copy_(torch.eye(max_rank, dtype=dtype, device=device))
            self.embed_at = torch.zeros(max_loras, vocab, max_rank, dtype=dtype, device=device)  # A_embᵀ
        if head_lora:
            self.head = LoraWeights.empty(max_loras, max_rank, hidden, [vocab], dtype=dtype, device=device)
        self.embed_full = torch.empty(embed_full, vocab, hidden, dtype=dtype, device=device) if embed_full else None
        self.head_full = torch.empty(head_full, vocab, hidden, dtype=dtype, device=device) if head_full else None
        # slot -> its copy index (-1: none); the device map has one more entry, -1, read by base tokens (slot -1)
        self.embed_full_of = torch.full((max_loras + 1,), -1, dtype=torch.long, device=device)
        self._embed_of = [-1] * max_loras
        self._head_of = [-1] * max_loras
        self._head_lora = [(0, 0.0)] * max_loras  # host copy of the head's (rank, scaling) per slot: no device sync
        self._free = {"embed": list(range(embed_full - 1, -1, -1)), "head": list(range(head_full - 1, -1, -1))}

    @property
    def nbytes(self) -> int:
        parts = [self.embed_at, self.head_full, self.embed_full]
        parts += [t for w in (self.embed, self.head) if w is not None for t in (w.a, w.b)]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    # --- slots -----------------------------------------------------------------------------------------------
    def install(self, slot: int, vocab) -> None:
        """Copy an adapter's `adapters.vocab.VocabWeights` (None: it has none) into `slot`."""
        self.clear(slot)
        if vocab is None:
            return
        if vocab.embed is not None:
            a, b, r = vocab.embed.a, vocab.embed.b, vocab.embed.rank  # a: [r, V], b: [H, r]
            self._need(self.embed, "embedding LoRA")
            self.embed_at[slot, :, :r].copy_(a.T, non_blocking=True)
            eye = torch.eye(self.embed.max_rank, dtype=b.dtype)[:r]  # [r, R]: the identity's rows the slot reads
            self.embed.set_slot(slot, [(eye, b, vocab.embed.scaling)])
        if vocab.head is not None:
            self._need(self.head, "lm_head LoRA")
            self.head.set_slot(slot, [(vocab.head.a, vocab.head.b, vocab.head.scaling)])
            self._head_lora[slot] = (vocab.head.rank, vocab.head.scaling)
        if vocab.embed_full is not None:
            f = self._take("embed", self.embed_full)
            self.embed_full[f].copy_(vocab.embed_full, non_blocking=True)
            self._embed_of[slot] = f
            self.embed_full_of[slot] = f
        if vocab.head_full is not None:
            f = self._take("head", self.head_full)
            self.head_full[f].copy_(vocab.head_full, non_blocking=True)
            self._head_of[slot] = f

    def clear(self, slot: int) -> None:
        """Forget the vocab adapters in `slot`; its full copies go back to the pool."""
        for w in (self.embed, self.head):
            if w is not None:
                w.clear_slot(slot)
        self._head_lora[slot] = (0, 0.0)
        if self._embed_of[slot] >= 0:
            self._free["embed"].append(self._embed_of[slot])
            self._embed_of[slot] = -1
            self.embed_full_of[slot] = -1
        if self._head_of[slot] >= 0:
            self._free["head"].append(self._head_of[slot])
            self._head_of[slot] = -1

    def _need(self, part, what: str) -> None:
        if part is None:
            raise RuntimeError(f"internal: a {what} adapter in a run started without {what} slots")

    def _take(self, which: str, pool) -> int:
        if pool is None or not self._free[which]:
            raise RuntimeError(f"internal: no free full-weight {which} slot (the pool is sized to the slots)")
        return self._free[which].pop()

    # --- the forward -----------------------------------------------------------------------------------------
    def embed_rows(self, h: torch.Tensor, ids: torch.Tensor, meta: LoraMeta | None) -> torch.Tensor:
        """h: [T, H] = E[ids] -> each adapted token's embedding (see the module docstring). Graph-safe."""
        if meta is None or not (meta.segments or meta.static):
            return h
        if self.embed_full is not None:
            f = self.embed_full_of[meta.token_slot.long()]  # [T]; slot -1 reads the last entry, -1
            h = torch.where((f >= 0)[:, None], self.embed_full[f.clamp_min(0), ids], h)
        if self.embed is not None:
            u = self.embed_at[meta.token_slot.long().clamp_min(0), ids]  # [T, R]: base tokens' rows are never read
            kernels.add_lora(h, u, self.embed, meta)
        return h

    @property
    def adapts_head(self) -> bool:
        return self.head is not None or self.head_full is not None

    def head_logits(self, logits: torch.Tensor, hidden: torch.Tensor, slots) -> torch.Tensor:
        """logits: [N, V] = hidden Wᵀ (any float dtype), hidden: [N, H], slots: [N] host ints (the rows' slots)
        -> the logits with each row's lm_head adapter (see the module docstring), before soft-capping."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if not self.adapts_head or not (slots >= 0).any():
            return logits
        if self.head is not None:
            if logits.dtype == hidden.dtype:  # the step's logits: SGMV, like every LoRA layer
                kernels.add_lora(logits, hidden, self.head, build_lora_meta(slots, hidden.device))
            else:  # fp32 logits (logprobs): the delta in fp32 too, per slot group
                for s in np.unique(slots[slots >= 0]).tolist():
                    r, scaling = self._head_lora[s]
                    if r == 0:
                        continue
                    idx = torch.from_numpy(np.flatnonzero(slots == s)).to(hidden.device)
                    u = (hidden[idx].float() @ self.head.a[s, 0, :r].float().T) * scaling  # [n, r]
                    logits[idx] += u @ self.head.b[s, :, :r].float().T
        if self.head_full is not None:
            for s in np.unique(slots[slots >= 0]).tolist():
                f = self._head_of[s]
                if f < 0:
                    continue
                idx = torch.from_numpy(np.flatnonzero(slots == s)).to(hidden.device)
                w = self.head_full[f]  # [V, H]
                if logits.dtype == torch.float32 and w.dtype != torch.float32 and hidden.is_cuda:
                    rows = torch.mm(hidden[idx].to(w.dtype), w.t(), out_dtype=torch.float32)
                else:
                    rows = torch.nn.functional.linear(hidden[idx].to(logits.dtype), w.to(logits.dtype))
                logits[idx] = rows.to(logits.dtype)
        return logits
