"""A Result's logprobs (engine TokenLogprob entries) -> the plain entries records are made of (io/line.LineLogprobs)."""

from __future__ import annotations

from multilora_cli.engine.request import Result, TokenLogprob
from multilora_cli.io.line import LineLogprobs


def entry(t: TokenLogprob) -> dict:
    """{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}, ...]} (most likely first)."""
    top = [{"id": i, "token": s, "logprob": v} for i, s, v in t.top]
    return {"id": t.id, "token": t.token, "logprob": t.logprob, "top_logprobs": top}


def line_logprobs(res: Result) -> LineLogprobs | None:
    """None when the line asked for neither logprobs, prompt_logprobs nor echo (its record is unchanged)."""
    asked = any(s.logprobs is not None for s in res.samples)
    if not asked and res.prompt_logprobs is None and res.echo_text is None:
        return None
    return LineLogprobs(
        choices=[None if s.logprobs is None else [entry(t) for t in s.logprobs] for s in res.samples],
        prompt=None if res.prompt_logprobs is None else [entry(t) for t in res.prompt_logprobs],
        echo=res.echo_text,
    )
