"""`GrammarRows`: each constrained sequence's matcher, and one step's token bitmask computed off the main thread.

A matcher follows its sequence's output tokens: it has consumed the first `consumed` of them, and `advance`
catches it up (tokens appended since, plus, for a step launched ahead, the token the step before it sampled,
read from that step's ids). Only ever forward: a preempted sequence keeps its tokens (it is recomputed, not
truncated: engine/sequence.py), so its matcher stays consistent and is kept; a forked sample (n > 1) starts its
own matcher from the compiled grammar; a finished sequence's is dropped.

Per step (`ModelRunner.launch`): `begin` submits the mask of the step's constrained rows to a worker thread
before the model is launched; the worker (for an ahead step: after the previous step's ids reached the host)
advances the matchers and has llguidance fill [C, W] int32 words on its own thread pool, GIL released, while
the main thread queues the forward; `finish` waits for it and copies mask and row indices to the device, where
the sampler applies them (kernels/bitmask.py). A step without constrained rows submits nothing: free rows pay
nothing. The grammar ends its row: once the matcher is stopped (complete, only eos allowed) the row finishes
with "stop" without sampling eos (`GrammarStop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from multilora_cli.engine.grammar.compiler import GrammarCompiler
from multilora_cli.engine.sequence import Sequence
from multilora_cli.errors import EngineError
from multilora_cli.kernels import use_triton


@dataclass(slots=True)
class GrammarMask:
    """One step's mask on the logits' device: rows [C] int64 (rows of the sampled logits), mask [C, W] int32."""

    rows: torch.Tensor
    mask: torch.Tensor

    def apply(self, logits: torch.Tensor, triton: bool | None = None) -> torch.Tensor:
        """A copy of `logits` ([N, V]) with the disallowed tokens of the constrained rows at -inf (the input stays
        the raw model's: logprobs are read from it)."""
        from multilora_cli.kernels.bitmask import apply_bitmask, apply_bitmask_torch  # constrained runs only

        out = logits.clone()
        if use_triton(logits) if triton is None else triton:
            apply_bitmask(out, self.rows, self.mask)
        else:
            apply_bitmask_torch(out, self.rows, self.mask)
        return out


@dataclass(slots=True)
class _Row:
    matcher: object  # llguidance.LLMatcher
    consumed: int = 0  # output tokens consumed so far


class GrammarRows:
    """Matchers of the running constrained sequences, keyed by seq_id. The engine's thread and the step's worker
    use it in turn, never together (`ModelRunner.launch` waits for the worker before it returns)."""

    def __init__(self, compiler: GrammarCompiler, max_rows: int, device: torch.device, threads: int | None = None):
        import llguidance

        self.compiler = compiler
        self.device = device
        self.words = (compiler.vocab_size + 31) // 32  # W: int32 words per row
        self._rows: dict[int, _Row] = {}
        self._executor = llguidance.LLExecutor(threads)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        pin = device.type == "cuda"
        # two host buffers taking turns, as the runner's ids do (at most two steps in flight)
        self._host = [torch.empty(max_rows, self.words, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._turn = 0
        # host seconds (benchmarks): the worker's mask fills, and how long the step waited for them after queueing
        # the forward (0 when the fill hid behind it)
        self.fill_seconds = 0.0
        self.wait_seconds = 0.0
        self.masks = 0

    def _row(self, seq: Sequence) -> _Row:
        row = self._rows.get(seq.seq_id)
        if row is None:
            row = self._rows[seq.seq_id] = _Row(self.compiler.matcher(seq.sampling.constraint))
        return row

    def advance(self, seq: Sequence, extra: int | None = None):
        """Seq's matcher after its output tokens (and `extra`, a token sampled but not appended yet)."""
        row = self._row(seq)
        out = seq.token_ids[len(seq.prompt_token_ids) + row.consumed :]
        if extra is not None:
            out = [*out, extra]
        if out:
            row.matcher.consume_tokens(out)
            row.consumed += len(out)
        return row.matcher

    def drop(self, seq: Sequence) -> None:
        self._rows.pop(seq.seq_id, None)

    def begin(self, seqs: list[Sequence], prev_ids: Callable[[], list[int]] | None = None) -> Future | None:
        """Start the mask of `seqs`' constrained rows (None when none is). prev_ids: for an ahead step, reads the
        ids of the step before it (row i's token is seqs[i]'s, not appended yet)."""
        rows = [i for i, s in enumerate(seqs) if s.sampling.constraint is not None]
        if not rows:
            return None
        self._turn ^= 1
        host = self._host[self._turn][: len(rows)]
        return self._worker.submit(self._fill, [seqs[i] for i in rows], rows, prev_ids, host)

    def _fill(self, seqs: list[Sequence], rows: list[int], prev_ids, host: torch.Tensor):
        ids = prev_ids() if prev_ids is not None else None
        t0 = time.perf_counter()  # (after the wait for the previous step's ids: that is not mask work)
        work = []
        for k, (seq, i) in enumerate(zip(seqs, rows)):
            m = self.advance(seq, None if ids is None else ids[i])
            if m.is_error():
                # a sequence that stopped at the step before (its token gets dropped) leaves nothing to mask
                if ids is not None and m.is_stopped():
                    host[k].fill_(-1)
                    continue
                raise EngineError(f"internal: request {seq.request.id} left its grammar: {m.get_error()}")
            work.append((m, k))
        if work:
            self._executor.unsafe_compute_mask_ptr(work, host.data_ptr(), self.words * 4, host.shape[0])
        self.fill_seconds += time.perf_counter() - t0
        return rows, host

    def finish(self, fut: Future) -> GrammarMask:
        """Wait for `begin`'s mask; on the device."""
        t0 = time.perf_counter()
        rows, host = fut.result()
        self.wait_seconds += time.perf_counter() - t0
        self.masks += 1
        return GrammarMask(
            torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True),
            host.to(self.device, non_blocking=True),
        )

    def close(self) -> None:
        self._worker.shutdown(wait=True)


class GrammarStop:
    """The engine's stop check with the grammar's end: `stop(seq)` first; a constrained row that did not stop
    otherwise finishes with "stop" once its matcher is stopped (the grammar is complete and allows only eos)."""

    def __init__(self, stop, rows: GrammarRows, tokenizer):
        self.stop, self.rows, self.tokenizer = stop, rows, tokenizer

    def __call__(self, seq: Sequence) -> str | None:
        reason = self.stop(seq)
        if reason is not None or seq.sampling.constraint is None:
            return reason
        m = self.rows.advance(seq)
        if m.is_error():
            raise EngineError(f"internal: request {seq.request.id} left its grammar: {m.get_error()}")
        if m.is_stopped():
            seq.text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            return "stop"
        return None

    def stopped_by_token(self, seq: Sequence) -> bool:
        return self.stop.stopped_by_token(seq)
