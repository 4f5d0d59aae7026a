"""Request fields that would change a line's output but are not served yet, and other systems' names for fields
that are: each one fails its line (an error record), because ignoring it would quietly give another output than
the line asks for, and nobody reads 100,000 outputs by hand.

A field given its no-op value ("suffix": "", "typical_p": 1) asks for
nothing multilora does not do, so it is accepted; null counts as not given. Keys in neither table are metadata
and stay ignored (`custom_id`, `meta`, `user`, ...), except near-misses of a known name (`near_miss`).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from multilora_cli.json_values import is_no_op, same_json

UNSUPPORTED = "unsupported_field"  # error code: a field multilora does not serve yet
UNKNOWN = "unknown_field"  # error code: a key that is another system's name (or a misspelling) of a served one

# field -> its no-op values (JSON values that change nothing; null always does). An empty tuple: any value
# asks for something multilora does not do.
NOT_SERVED: dict[str, tuple] = {
    # beams, scoring (`n` is served; `best_of` is accepted equal to n: `refusal`)
    "use_beam_search": (False,),
    "num_beams": (1,),
    "length_penalty": (1, 1.0),
    # served by one format only: `continuation` by simple lines (OpenAI's scoring is echo + max_tokens 0), `echo`
    # by /v1/completions bodies and `top_logprobs` by /v1/chat/completions bodies (io/openai_batch.py)
    "continuation": (),
    "echo": (False,),
    "top_logprobs": (0,),
    "suffix": ("",),
    # logits processing (the penalties, logit_bias, min_p, min_tokens, stop_token_ids and ignore_eos are served)
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "bad_words_ids": ([],),
    "no_repeat_ngram_size": (0,),
    "typical_p": (1, 1.0),
    "epsilon_cutoff": (0,),
    "eta_cutoff": (0,),
    "truncate_prompt_tokens": (),
    # structured output (response_format is served in both formats; regex and choice in the simple one, whose
    # own fields are read before this table: refused here in an OpenAI body), tools
    "regex": (),
    "choice": (),
    "grammar": (),
    "json_schema": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none", "auto"),  # without tools (refused on their own) neither can call anything
    "function_call": ("none", "auto"),
    # chat template and model options
    "chat_template": (),
    "chat_template_kwargs": ({},),  # e.g. {"enable_thinking": false} for Qwen3
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "reasoning_effort": (),
    "modalities": (["text"],),
    "audio": (),
    "web_search_options": (),
    "verbosity": (),
}

# other systems' name -> (multilora's name, why, no-op values): a "did you mean"
RENAMED: dict[str, tuple[str, str, tuple]] = {
    "max_new_tokens": ("max_tokens", "max_new_tokens is the transformers name: rename the key", ()),
    "max_length": ("max_tokens", "transformers' max_length counts the prompt too: give the tokens to generate", ()),
    "max_completion_tokens": ("max_tokens", "max_completion_tokens is the OpenAI chat name: rename the key", ()),
    "stop_sequences": ("stop", "stop_sequences is the TGI / Anthropic name: rename the key", ([],)),
    "num_return_sequences": ("n", "num_return_sequences is the transformers name: rename the key", (1,)),
    "min_new_tokens": ("min_tokens", "min_new_tokens is the transformers name: rename the key", (0,)),
    "min_length": ("min_tokens", "transformers' min_length counts the prompt too: give the tokens to generate", (0,)),
}
# refused or not depending on the rest of the line (`refusal`)
SPECIAL = ("do_sample", "add_special_tokens", "best_of")

# Near-miss candidates beyond a format's own fields: names long and specific enough that a key close to one is a
# misspelling, not metadata (a short word like "choice" is left out: "choices" is a likely metadata key).
SPECIFIC = tuple(n for n in (*NOT_SERVED, *RENAMED, *SPECIAL) if "_" in n) + ("logprobs",)


def _do_sample(value: Any, container: dict) -> str | None:
    """transformers' do_sample is accepted beside a `temperature` that says the same (true: > 0, false: 0);
    alone it would be ignored and the CLI / generation_config default would decide instead."""
    t = container.get("temperature")
    number = isinstance(t, (int, float)) and not isinstance(t, bool)
    if value is None or (value is True and number and t > 0) or (value is False and number and t == 0):
        return None
    if value is True:
        what = 'do_sample true samples: give "temperature" > 0, e.g. 1.0 as transformers does'
    elif value is False:
        what = 'do_sample false is greedy: give "temperature": 0'
    else:
        what = 'give "temperature" > 0 to sample, 0 for greedy'
    return f"{what}; do_sample is accepted only beside a temperature that agrees with it"


def _best_of(name: str, value: Any, container: dict, where: str) -> tuple[str, str] | None:
    """best_of (vLLM, legacy completions: draw best_of, return the n most likely) is accepted equal to n, which
    returns every sample drawn; more than n would need a choice multilora does not make."""
    n = container.get("n")
    n = 1 if n is None else n
    if value is None or same_json(value, n):
        return None
    count = isinstance(value, int) and not isinstance(value, bool)
    if count and isinstance(n, int) and not isinstance(n, bool) and value > n:
        return (
            f"field {name!r} {value} above {where}n ({n}) is not supported: multilora returns every sample it "
            f"draws and does not pick the best ones (remove it, or give {n})",
            UNSUPPORTED,
        )
    return f"{name} must be an integer equal to {where}n ({json.dumps(n)}), got {json.dumps(value)}", "invalid_sampling"


def refusal(key: str, value: Any, container: dict, where: str = "") -> tuple[str, str] | None:
    """(message, code) when `key` (of `container`, a line or an OpenAI body) must fail the line, else None.
    where: the prefix naming the container in messages ("body.")."""
    name = f"{where}{key}"
    if key == "do_sample":
        why = _do_sample(value, container)
        if why is None:
            return None
        return f"unknown field {name!r}: did you mean {where + 'temperature'!r}? ({why})", UNKNOWN
    if key == "add_special_tokens":  # the tokenizer's default: on for a prompt, off for rendered chat messages
        neutral = (container.get("messages") is None,)
        if is_no_op(value, neutral):
            return None
        return _not_served(name, neutral), UNSUPPORTED
    if key == "best_of":
        return _best_of(name, value, container, where)
    if key in RENAMED:
        target, why, neutral = RENAMED[key]
        if is_no_op(value, neutral):
            return None
        return f"unknown field {name!r}: did you mean {where + target!r}? ({why})", UNKNOWN
    if key in NOT_SERVED:
        neutral = NOT_SERVED[key]
        return None if is_no_op(value, neutral) else (_not_served(name, neutral), UNSUPPORTED)
    return None


def _not_served(name: str, neutral: tuple) -> str:
    fix = f"remove it, or give {json.dumps(neutral[0])}" if neutral else "remove it"
    return (
        f"field {name!r} is not supported yet: multilora would ignore it and the output would not be what the "
        f"line asks for ({fix})"
    )


def near_miss(key: Any, known: tuple[str, ...]) -> str | None:
    """The name `key` looks like a misspelling of, among `known` and the specific names above (None for a known
    name or an unrelated one). A renamed field's near-miss points at the name multilora reads."""
    if not isinstance(key, str) or key in known or key in NOT_SERVED or key in RENAMED or key in SPECIAL:
        return None
    close = difflib.get_close_matches(key.lower().replace("-", "_"), (*known, *SPECIFIC), n=1, cutoff=0.8)
    if not close or close[0] in known:
        return close[0] if close else None
    return "temperature" if close[0] == "do_sample" else RENAMED[close[0]][0] if close[0] in RENAMED else close[0]
