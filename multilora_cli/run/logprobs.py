"""A Result's logprobs -> what its record shows (io/line.LineLogprobs). The engine's TokenLogprob entries go as
they are: the formats write their JSON text straight from them (io/logprob_json.py), with no dict per token."""

from __future__ import annotations

from multilora_cli.engine.request import Result
from multilora_cli.io.line import LineLogprobs


def line_logprobs(res: Result) -> LineLogprobs | None:
    """None when the line asked for neither logprobs, prompt_logprobs nor echo (its record is unchanged)."""
    asked = any(s.logprobs is not None for s in res.samples)
    if not asked and res.prompt_logprobs is None and res.echo_text is None:
        return None
    return LineLogprobs(
        choices=[s.logprobs for s in res.samples],
        prompt=res.prompt_logprobs,
        echo=res.echo_text,
    )
