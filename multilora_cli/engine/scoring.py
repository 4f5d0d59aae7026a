"""Scoring requests: tokenize (context, continuation) as lm-evaluation-harness does, and the `Score` of a
finished scoring sequence.

lm-evaluation-harness (`_encode_pair`): trailing whitespace of the context moves to the continuation; then
whole = encode(context + continuation), context_enc = encode(context) and continuation_enc =
whole[len(context_enc):], so a token that spans the boundary belongs to the continuation. An empty context is
the prefix token (BOS, else EOS) before encode(continuation). `encode` is the model's tokenizer with its own
special tokens (BOS for Llama), as a plain prompt is encoded. The model then runs over whole[:-1]; the logprob of
continuation token j comes from position len(context_enc) - 1 + j.
"""

from __future__ import annotations

from multilora_cli.engine.logprobs import unpack
from multilora_cli.engine.request import Request, Score
from multilora_cli.engine.sequence import Sequence
from multilora_cli.errors import RequestError


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], int]:
    """(whole ids, number of context ids) of a scoring pair; RequestError when the continuation has no token."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    if not context:
        bos = tokenizer.bos_token_id
        prefix = bos if bos is not None else tokenizer.eos_token_ids[0]
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        return [prefix, *cont], 1
    whole = tokenizer.encode(context + continuation)
    n_ctx = len(tokenizer.encode(context))
    return whole, n_ctx


def scoring_ids(tokenizer, request: Request) -> tuple[list[int], int]:
    """A scoring request's prompt ids and context length, or RequestError for a request that cannot be scored."""
    if request.prompt is None:
        raise RequestError(
            f"request {request.id}: a continuation is scored after a text 'prompt' (not messages or token ids)"
        )
    if request.sampling.n != 1:
        raise RequestError(f"request {request.id}: a scoring line takes no n (it generates nothing)")
    ids, n_ctx = encode_pair(tokenizer, request.prompt, request.continuation)
    if n_ctx < 1:
        raise RequestError(f"request {request.id}: the prompt (the context) encodes to no token")
    if len(ids) <= n_ctx:
        raise RequestError(
            f"request {request.id}: the continuation {request.continuation!r} has no token of its own after the "
            "prompt (empty, or merged into the prompt's last token)",
            code="empty_continuation",
        )
    return ids, n_ctx


def score_of(seq: Sequence) -> Score:
    """The Score of a finished scoring sequence: its prompt_lp rows are the continuation's tokens, in order."""
    rows = unpack(seq.prompt_lp)
    lps = [row[0] for row in rows]
    greedy = all(row[1] == t for row, t in zip(rows, seq.prompt_token_ids[seq.prompt_logits_from + 1 :]))
    return Score(logprob=sum(lps), is_greedy=greedy, token_logprobs=lps)
