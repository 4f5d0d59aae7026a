"""What rank 0 and a worker say to each other: plain tuples of picklable values.

rank 0 -> worker (down channel):
  ("start", EngineConfig, {adapter: path}, options)   build the engine (options: threads)
  ("requests", [Request, ...])                          more work, in input order
  ("end",)                                              no more requests: finish and report
  ("stop",)                                             nothing to do (or the run failed): exit now
worker -> rank 0 (up channel):
  ("ready", info)                                       engine built; info: host, pid, device, load_seconds
  ("results", [packed Result, ...], live)               finished requests; live: {"slot_loads": n}
  ("done", EngineStats dict, info)                      all its requests answered
  ("failed", message)                                   a fatal error on that worker (it exits 1)

Results travel as tuples, not Result objects: a MultiloraError does not survive pickling with its `code`
and `hint`, so an error travels as (code, one-line message) and comes back as a RequestError. A request with
n > 1 carries its samples as (text, token_ids, finish_reason, completion_tokens, logprobs) tuples in index order;
for n=1 the top-level fields are its one sample (and its logprobs). Logprobs, prompt logprobs and a scoring
line's Score travel as the engine's own dataclasses (plain values), None when not asked.
"""

from __future__ import annotations

import os
import platform

from multilora_cli.engine.request import Result, Sample
from multilora_cli.errors import RequestError

START, REQUESTS, END, STOP = "start", "requests", "end", "stop"
READY, RESULTS, DONE, FAILED = "ready", "results", "done", "failed"
TEST_EXIT_ENV = "MULTILORA_TEST_WORKER_EXIT"  # tests only: "RANK:K" makes worker RANK die after K results


def pack_result(r: Result) -> tuple:
    err = None if r.error is None else (r.error.code, r.error.one_line())
    samples = None
    if len(r.samples) > 1:
        samples = [(s.text, s.token_ids, s.finish_reason, s.completion_tokens, s.logprobs) for s in r.samples]
    return (
        r.key,
        r.id,
        r.adapter,
        r.text,
        r.token_ids,
        r.finish_reason,
        r.prompt_tokens,
        r.completion_tokens,
        err,
        samples,
        r.samples[0].logprobs if len(r.samples) == 1 else None,
        r.prompt_logprobs,
        r.score,
        r.echo_text,
    )


def unpack_result(t: tuple) -> Result:
    key, rid, adapter, text, token_ids, finish, pt, ct, err, packed, logprobs, prompt_lp, score, echo = t
    error = None if err is None else RequestError(err[1], code=err[0])
    if packed is not None:
        samples = [Sample(i, *s) for i, s in enumerate(packed)]
    elif error is None and score is None:
        samples = [Sample(0, text, token_ids, finish, ct, logprobs)]
    else:
        samples = []
    return Result(
        key=key,
        id=rid,
        adapter=adapter,
        text=text,
        token_ids=token_ids,
        finish_reason=finish,
        prompt_tokens=pt,
        completion_tokens=ct,
        error=error,
        samples=samples,
        prompt_logprobs=prompt_lp,
        score=score,
        echo_text=echo,
    )


def where(device: str = "") -> dict:
    """Who this process is, for messages and stats."""
    return {"host": platform.node(), "pid": os.getpid(), "device": device}


def test_exit_after(rank: int) -> int | None:
    """The test hook: how many results worker `rank` returns before it os._exit()s; None = never."""
    spec = os.environ.get(TEST_EXIT_ENV, "")
    if not spec:
        return None
    r, _, k = spec.partition(":")
    return int(k) if r.strip() and int(r) == rank else None
