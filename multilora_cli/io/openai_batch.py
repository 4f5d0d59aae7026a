"""The OpenAI Batch API JSONL format (what `client.batches` uploads and downloads).

Input:  {"custom_id", "method": "POST", "url": "/v1/completions" | "/v1/chat/completions",
         "body": {"model": <adapter name | base model name | "base">, "prompt" | "messages",
                  "max_tokens" | "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
                  "frequency_penalty", "presence_penalty", "logit_bias" (OpenAI's), "min_p", "repetition_penalty",
                  "min_tokens", "stop_token_ids", "ignore_eos", "prompt_logprobs" (vLLM's extensions of the same
                  bodies), "response_format" (json_object, json_schema: constraint.py), completions: "logprobs" k,
                  "echo" (with max_tokens 0: score the prompt, generate nothing); chat: "logprobs" true/false,
                  "top_logprobs" k}}
        Body fields that would change the output but are not served yet (`tools`, `regex`, `best_of` > n,
        ...: io/unserved.py) fail the line unless given their no-op value, as do other
        systems' names (`max_new_tokens`) and near-misses of served ones; OpenAI metadata (`user`, `metadata`,
        `store`, `stream` false, `stream_options`, `service_tier`) and other keys are ignored.
Output: {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id", "body": <completion>},
         "error": null} (<completion>: OpenAI's, with n choices, index 0 .. n-1, and usage over all of them;
         each choice's "logprobs" in OpenAI's shape for its endpoint: io/logprob_records.py);  failure: {"id", "custom_id", "response": null, "error": {"code", "message"}}

Record ids are derived from (line number, custom_id), so a resumed run writes the same ids as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import time
from functools import partial
from typing import Any

from multilora_cli.io import logprob_records
from multilora_cli.io.line import OPENAI, SAMPLING_FIELDS, Choice, LineLogprobs, LineSpec, check_messages, json_type
from multilora_cli.io.logprob_json import TokenJson
from multilora_cli.io.record_json import RawJson
from multilora_cli.io.unserved import UNKNOWN, UNSUPPORTED, near_miss, refusal

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
URLS = (COMPLETIONS, CHAT)
# body fields served (a near-miss of one fails the line) and OpenAI metadata that cannot change the output
SAMPLING = (
    *(f for f in SAMPLING_FIELDS if f != "max_tokens"),
    "response_format",
)  # copied as they are; max_tokens has a synonym
BODY_FIELDS = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "echo", "top_logprobs", *SAMPLING)
METADATA = ("user", "metadata", "store", "stream", "stream_options", "service_tier", "prediction")


class OpenAIBatchFormat:
    name = OPENAI

    def __init__(self) -> None:
        self._json = TokenJson()  # token id -> its JSON fragments, for this run's logprob records

    def default_id(self, lineno: int) -> Any:
        return None  # no custom_id to echo for a line we could not read

    def parse(self, obj: dict, key: int, lineno: int) -> LineSpec:
        cid = obj.get("custom_id")
        spec = LineSpec(key, lineno, cid)
        if not isinstance(cid, str) or not cid:
            spec.id = cid if isinstance(cid, (str, int)) and not isinstance(cid, bool) else None
            return spec.fail(f"custom_id must be a non-empty string, got {json_type(cid)}", "missing_custom_id")
        method = obj.get("method", "POST")
        if not isinstance(method, str) or method.upper() != "POST":
            return spec.fail(f"method must be POST, got {method!r}", "invalid_method")
        url = obj.get("url")
        spec.meta["url"] = url
        if url not in URLS:
            return spec.fail(f"url {url!r} is not supported; use {COMPLETIONS} or {CHAT}", "invalid_url")
        body = obj.get("body")
        if not isinstance(body, dict):
            what = "missing" if body is None else f"{json_type(body)}, not an object"
            return spec.fail(f"body is {what}; it must be an object with 'model' and the request", "missing_body")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return spec.fail(
                "body.model is required: an adapter name, or 'base' / the base model's name", "missing_model"
            )
        spec.adapter = model
        spec.meta["model"] = model
        if url == COMPLETIONS:
            self._prompt(spec, body)
            spec.meta["prompt_chars"] = len(spec.prompt or "")
        else:
            if body.get("prompt") is not None:
                return spec.fail(f"{CHAT} takes 'messages', not 'prompt' (use {COMPLETIONS} for a prompt)")
            if body.get("messages") is None:
                return spec.fail(f"body.messages is required for {CHAT}", "missing_prompt")
            spec.messages = check_messages(spec, body["messages"])
        if spec.error is None:
            self._sampling(spec, body)
        return spec

    @staticmethod
    def _prompt(spec: LineSpec, body: dict) -> None:
        prompt = body.get("prompt")
        if body.get("messages") is not None:
            spec.fail(f"{COMPLETIONS} takes 'prompt', not 'messages' (use {CHAT} for messages)")
        elif prompt is None:
            spec.fail(f"body.prompt is required for {COMPLETIONS}", "missing_prompt")
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            spec.prompt = prompt[0]
        elif isinstance(prompt, str):
            spec.prompt = prompt
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            spec.prompt_token_ids = prompt
        else:
            spec.fail(
                "body.prompt must be a string, a list of one string, or a list of token ids (one prompt per line)"
            )

    @staticmethod
    def _sampling(spec: LineSpec, body: dict) -> None:
        mt, mct = body.get("max_tokens"), body.get("max_completion_tokens")
        if mt is not None and mct is not None and mt != mct:
            spec.fail("give max_tokens or max_completion_tokens, not both")
            return
        s = {k: body[k] for k in SAMPLING if body.get(k) is not None}
        if mt is not None or mct is not None:
            s["max_tokens"] = mct if mct is not None else mt
        spec.sampling = s
        if spec.meta.get("url") == CHAT:
            OpenAIBatchFormat._chat_logprobs(spec, body)
        else:
            OpenAIBatchFormat._completion_logprobs(spec, body)
        if spec.error is not None:
            return
        if body.get("stream") not in (None, False):
            spec.fail(
                f"field 'body.stream' {json.dumps(body['stream'])} is not supported: a batch line cannot stream "
                "(remove it, or give false)",
                UNSUPPORTED,
            )
            return
        for k, v in body.items():
            if k in BODY_FIELDS or k in METADATA:
                continue
            if (refused := refusal(k, v, body, "body.")) is not None:
                spec.fail(*refused)
                return
            if (known := near_miss(k, BODY_FIELDS)) is not None:
                spec.fail(
                    f"unknown field 'body.{k}': did you mean 'body.{known}'? (fix the key; fields that are not "
                    "near-misses of a known one are ignored)",
                    UNKNOWN,
                )
                return

    @staticmethod
    def _chat_logprobs(spec: LineSpec, body: dict) -> None:
        """Chat: `logprobs` true/false, `top_logprobs` k (0..20) only beside logprobs true; no `echo`."""
        s, lp, top = spec.sampling, body.get("logprobs"), body.get("top_logprobs")
        s.pop("logprobs", None)
        if body.get("echo") not in (None, False):
            spec.fail(f"field 'body.echo' is not a {CHAT} field (use {COMPLETIONS} to echo a prompt)", UNSUPPORTED)
        elif lp not in (None, True, False):
            spec.fail(f"body.logprobs must be true or false for {CHAT}, got {json.dumps(lp)}", "invalid_sampling")
        elif lp is True:
            s["logprobs"] = 0 if top is None else top
        elif top not in (None, 0):
            spec.fail("body.top_logprobs needs body.logprobs true", "invalid_sampling")

    @staticmethod
    def _completion_logprobs(spec: LineSpec, body: dict) -> None:
        """Completions: `logprobs` k; `echo` true puts the prompt (and, with logprobs, its tokens' logprobs) in
        front of the completion; max_tokens 0 with echo generates nothing (scoring, as lm-evaluation-harness
        asks for it)."""
        s, echo = spec.sampling, body.get("echo")
        if body.get("top_logprobs") not in (None, 0):
            spec.fail(f"body.top_logprobs is a {CHAT} field: {COMPLETIONS} takes logprobs k", UNKNOWN)
            return
        if echo not in (None, True, False):
            spec.fail(f"body.echo must be true or false, got {json.dumps(echo)}")
            return
        if not echo:
            return
        spec.echo = True
        spec.meta["echo"] = True
        if s.get("logprobs") is not None and "prompt_logprobs" not in s:
            s["prompt_logprobs"] = s["logprobs"]
        if s.get("max_tokens") == 0:
            if s.get("n", 1) != 1:
                spec.fail("echo with max_tokens 0 generates nothing: give no n (or 1)", "invalid_sampling")
                return
            spec.generate = False
            del s["max_tokens"]

    # -- records --------------------------------------------------------------------------------------------
    @staticmethod
    def _hash(spec: LineSpec) -> str:
        return hashlib.sha256(f"{spec.lineno}\n{spec.id}".encode("utf-8", "surrogatepass")).hexdigest()

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
        h = self._hash(spec)
        chat = spec.meta.get("url") == CHAT
        if chat:
            body_id, obj = f"chatcmpl-{h[:24]}", "chat.completion"
        else:
            body_id, obj = f"cmpl-{h[:24]}", "text_completion"
        listed = []
        lp = logprobs or LineLogprobs()
        echo = lp.echo if lp.echo is not None else ""
        for i, (t, f) in enumerate(choices if choices is not None else [(text, finish_reason)]):
            choice: dict = {"index": i}
            entries = lp.choices[i] if lp.choices is not None else None
            if chat:
                choice["message"] = {"role": "assistant", "content": t}
                if entries is None:
                    choice["logprobs"] = None
                else:
                    choice["logprobs"] = RawJson(self._json.chat(entries), partial(logprob_records.chat, entries))
            else:
                choice["text"] = echo + t
                shown = entries
                if lp.echo is not None and lp.prompt is not None:
                    shown = [*lp.prompt, *(entries or [])]
                # echo: the prompt's tokens first, offsets from the prompt's start; else from its end
                start = 0 if lp.echo is not None else spec.meta.get("prompt_chars", 0)
                if shown is None:
                    choice["logprobs"] = None
                else:
                    text = self._json.legacy(shown, start)
                    choice["logprobs"] = RawJson(text, partial(logprob_records.legacy, shown, start))
            if lp.prompt is not None and lp.echo is None and i == 0:  # vLLM's prompt_logprobs extension
                p = lp.prompt
                choice["prompt_logprobs"] = RawJson(
                    self._json.simple_prompt(p), partial(logprob_records.simple_prompt, p)
                )
            choice["finish_reason"] = f
            listed.append(choice)
        body = {
            "id": body_id,
            "object": obj,
            "created": int(time.time()),
            "model": spec.meta.get("model"),
            "choices": listed,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return {
            "id": f"batch_req_{h[:32]}",
            "custom_id": spec.id,
            "response": {"status_code": 200, "request_id": f"req_{h[32:56]}", "body": body},
            "error": None,
        }

    def score_record(self, spec: LineSpec, logprob: float, is_greedy: bool, token_logprobs: list[float]) -> dict:
        raise TypeError("OpenAI batch lines score through echo + max_tokens 0: `continuation` is refused")

    def error_record(self, spec: LineSpec, code: str, message: str) -> dict:
        return {
            "id": f"batch_req_{self._hash(spec)[:32]}",
            "custom_id": spec.id,
            "response": None,
            "error": {"code": code, "message": message},
        }

    def record_id(self, record: dict) -> Any:
        return record.get("custom_id")

    def is_error_record(self, record: dict) -> bool:
        return record.get("error") is not None

    def looks_like_record(self, record: dict) -> bool:
        return "custom_id" in record and "response" in record
