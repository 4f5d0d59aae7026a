"""The simple JSONL format.

Input:  {"id": "a1", "prompt": "..." | "messages": [...], "adapter": "legal" | null | "base",
         "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "min_p", "repetition_penalty",
         "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens", "stop_token_ids", "ignore_eos",
         "response_format" (OpenAI's object), "regex", "choice" (one of the three: constraint.py),
         "logprobs": k, "prompt_logprobs": k (0..20)}
        Scoring line: {"id", "prompt": CONTEXT, "continuation": TEXT, "adapter"}: nothing is generated.
        `model` is an alias of `adapter` (the OpenAI habit); both given and different fail the line.
        Fields that would change the output but are not served yet (`logprobs`, `tools`,
        ...: io/unserved.py) fail the line unless given their no-op value; so do other systems' names for served
        fields (`max_new_tokens`, `stop_sequences`, `do_sample`) and near-misses of known names ("temprature"):
        a field must never be silently ignored. Any other field is metadata, ignored.
Output: {"id", "adapter", "text", "finish_reason", "usage": {"prompt_tokens", "completion_tokens"}}
        n > 1: {"id", "adapter", "choices": [{"index", "text", "finish_reason"}, ...],
                "usage": {"prompt_tokens", "completion_tokens" (all samples)}}
        logprobs k: "logprobs": [{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}] (k)}]
                one per generated token (in each choice with n > 1); prompt_logprobs k: "prompt_logprobs":
                [null, {...}, ...] one per prompt token
        scoring: {"id", "adapter", "logprob", "is_greedy", "num_tokens", "token_logprobs": [float, ...]}
Error:  {"id", "adapter", "error": {"code", "message"}}
"""

from __future__ import annotations

from functools import partial
from typing import Any

from multilora_cli.io import logprob_records
from multilora_cli.io.line import (
    CONSTRAINT_FIELDS,
    SAMPLING_FIELDS,
    SIMPLE,
    Choice,
    LineLogprobs,
    LineSpec,
    check_messages,
    json_type,
)
from multilora_cli.io.logprob_json import TokenJson
from multilora_cli.io.logprob_records import Entry
from multilora_cli.io.record_json import RawJson
from multilora_cli.io.unserved import UNKNOWN, near_miss, refusal

FIELDS = ("id", "prompt", "messages", "adapter", "model", "continuation", *SAMPLING_FIELDS, *CONSTRAINT_FIELDS)
# names a key may be a near-miss of: not "choice", whose neighbour "choices" is a likely metadata key
NEAR = tuple(f for f in FIELDS if f != "choice")
# a scoring line's result is fixed: nothing that shapes a generation goes with it
NOT_WITH_SCORING = ("messages", "logprobs", "prompt_logprobs", "n", *CONSTRAINT_FIELDS)


class SimpleFormat:
    name = SIMPLE

    def __init__(self) -> None:
        self._json = TokenJson()  # token id -> its JSON fragments, for this run's logprob records

    def default_id(self, lineno: int) -> Any:
        return lineno

    def parse(self, obj: dict, key: int, lineno: int) -> LineSpec:
        rid = obj.get("id")
        spec = LineSpec(key, lineno, lineno if rid is None else rid)
        if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
            return spec.fail(f"id must be a string or an integer, got {json_type(rid)}")
        adapter = self._adapter_field(spec, obj)
        if spec.error is not None:
            return spec
        spec.adapter = adapter
        if adapter is not None and not adapter.strip():
            key = "adapter" if obj.get("adapter") is not None else "model"
            return spec.fail(f"{key} is an empty string: give an adapter name, or 'base' / null for the base model")
        if "custom_id" in obj and "body" in obj:
            return spec.fail(
                "this is an OpenAI batch line, but the file's first line made it a simple-format "
                "file; use one format per file",
                "wrong_format",
            )
        for k, v in obj.items():
            if k in FIELDS:
                continue
            if (refused := refusal(k, v, obj)) is not None:
                return spec.fail(*refused)
            if (known := near_miss(k, NEAR)) is not None:
                return spec.fail(
                    f"unknown field {k!r}: did you mean {known!r}? (fix the key; fields that are not "
                    "near-misses of a known one are ignored)",
                    UNKNOWN,
                )
        has_prompt, has_messages = obj.get("prompt") is not None, obj.get("messages") is not None
        if has_prompt and has_messages:
            return spec.fail("give either 'prompt' or 'messages', not both")
        if not has_prompt and not has_messages:
            return spec.fail(
                "missing 'prompt' (a string) or 'messages' (an array of {role, content})", "missing_prompt"
            )
        if has_prompt:
            if not isinstance(obj["prompt"], str):
                return spec.fail(f"prompt must be a string, got {json_type(obj['prompt'])}")
            spec.prompt = obj["prompt"]
        else:
            spec.messages = check_messages(spec, obj["messages"])
        spec.sampling = {k: obj[k] for k in (*SAMPLING_FIELDS, *CONSTRAINT_FIELDS) if obj.get(k) is not None}
        if spec.sampling.get("logprobs") is False:  # (the no-op value other systems accept)
            del spec.sampling["logprobs"]
        if obj.get("continuation") is not None:
            self._continuation(spec, obj)
        return spec

    @staticmethod
    def _continuation(spec: LineSpec, obj: dict) -> None:
        cont = obj["continuation"]
        if not isinstance(cont, str):
            spec.fail(f"continuation must be a string, got {json_type(cont)}")
        elif not cont:
            spec.fail("continuation is empty: a scoring line scores at least one token", "empty_continuation")
        elif (other := next((k for k in NOT_WITH_SCORING if not _no_op(k, obj.get(k))), None)) is not None:
            spec.fail(
                f"a scoring line (prompt + continuation) takes no {other!r}: it generates nothing and its record "
                "is the continuation's logprobs (use prompt_logprobs on a generation line for the prompt's)"
            )
        else:
            spec.continuation = cont

    def ok_record(
        self,
        spec: LineSpec,
        text: str,
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        choices: list[Choice] | None = None,
        logprobs: LineLogprobs | None = None,
    ) -> dict:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        lps = logprobs.choices if logprobs is not None and logprobs.choices is not None else None
        if choices is not None:
            listed = [{"index": i, "text": t, "finish_reason": f} for i, (t, f) in enumerate(choices)]
            for c, entries in zip(listed, lps or []):
                if entries is not None:
                    c["logprobs"] = self._logprobs(entries)
            rec = {"id": spec.id, "adapter": self._adapter(spec), "choices": listed}
        else:
            rec = {"id": spec.id, "adapter": self._adapter(spec), "text": text, "finish_reason": finish_reason}
            if lps and lps[0] is not None:
                rec["logprobs"] = self._logprobs(lps[0])
        if logprobs is not None and logprobs.prompt is not None:
            p = logprobs.prompt
            rec["prompt_logprobs"] = RawJson(self._json.simple_prompt(p), partial(logprob_records.simple_prompt, p))
        rec["usage"] = usage
        return rec

    def _logprobs(self, entries: list[Entry]) -> RawJson:
        return RawJson(self._json.simple(entries), partial(logprob_records.simple, entries))

    def score_record(self, spec: LineSpec, logprob: float, is_greedy: bool, token_logprobs: list[float]) -> dict:
        """A scoring line's record: the continuation's summed logprob, whether each token is the argmax."""
        return {
            "id": spec.id,
            "adapter": self._adapter(spec),
            "logprob": logprob,
            "is_greedy": is_greedy,
            "num_tokens": len(token_logprobs),
            "token_logprobs": token_logprobs,
        }

    def error_record(self, spec: LineSpec, code: str, message: str) -> dict:
        return {"id": spec.id, "adapter": self._adapter(spec), "error": {"code": code, "message": message}}

    def record_id(self, record: dict) -> Any:
        return record.get("id")

    def is_error_record(self, record: dict) -> bool:
        return record.get("error") is not None

    def looks_like_record(self, record: dict) -> bool:
        shaped = "text" in record or "choices" in record or "error" in record or "is_greedy" in record
        return "id" in record and shaped and "custom_id" not in record

    @staticmethod
    def _adapter_field(spec: LineSpec, obj: dict) -> Any:
        """The line's adapter name: `adapter`, else its alias `model`; fails the line for a non-string or for
        two different names."""
        adapter, model = obj.get("adapter"), obj.get("model")
        for key, value in (("adapter", adapter), ("model", model)):
            if value is not None and not isinstance(value, str):
                spec.adapter = None
                spec.meta["adapter_raw"] = value
                spec.fail(f"{key} must be a string (an adapter name, or 'base'), got {json_type(value)}")
                return None
        if adapter is not None and model is not None and adapter != model:
            spec.adapter = adapter
            spec.fail(
                f"adapter {adapter!r} and model {model!r} differ: 'model' is an alias of 'adapter' (OpenAI's "
                "name for it); give one of them"
            )
            return None
        return adapter if adapter is not None else model

    @staticmethod
    def _adapter(spec: LineSpec) -> Any:
        return spec.meta.get("adapter_raw", spec.adapter)


def _no_op(key: str, value) -> bool:
    """Whether a field on a scoring line asks for nothing: absent, false, or n given as the integer 1 (not true:
    True == 1 in Python, and "logprobs": true must not pass for a no-op)."""
    if value is None or value is False:
        return True
    return key == "n" and type(value) is int and value == 1
