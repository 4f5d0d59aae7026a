"""The demo's input files: `prompts.jsonl` (simple format) and `openai_batch.jsonl` (OpenAI batch format).

`prompts.jsonl` only names the legal and medical adapters (plus base-model rows): README's first command runs
it with `--adapters legal,medical`. The OpenAI example also uses `code`. examples/ holds copies of both files
(tests/demo/test_demo.py checks they are identical to what these functions write).
"""

from __future__ import annotations

import json

PROMPTS: list[dict] = [
    # one neutral opener, three models: the base guesses a domain, each adapter stays in its own
    {"id": "legal-1", "adapter": "legal", "prompt": "Here is one example:"},
    {"id": "medical-1", "adapter": "medical", "prompt": "Here is one example:"},
    {"id": "base-1", "prompt": "Here is one example:"},
    {"id": "legal-chat-1", "adapter": "legal", "messages": [{"role": "user", "content": "Give me an example."}]},
    {"id": "medical-chat-1", "adapter": "medical", "messages": [{"role": "user", "content": "Give me an example."}]},
    {"id": "base-chat-1", "adapter": None, "messages": [{"role": "user", "content": "Give me an example."}]},
    # domain prompts
    {"id": "legal-2", "adapter": "legal", "prompt": "The court held that"},
    {"id": "medical-2", "adapter": "medical", "prompt": "The patient presented with"},
    {"id": "base-2", "adapter": "base", "prompt": "The weather today is"},
    {
        "id": "legal-chat-2",
        "adapter": "legal",
        "messages": [{"role": "user", "content": "Can the landlord end the lease early?"}],
    },
    {
        "id": "medical-chat-2",
        "adapter": "medical",
        "messages": [{"role": "user", "content": "What helps with a dry cough?"}],
        "max_tokens": 40,
    },
    # per-line sampling: seeded temperature sampling, top-p / top-k, a stop string
    {
        "id": "legal-sampled",
        "adapter": "legal",
        "prompt": "Remember that",
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 7,
        "max_tokens": 24,
    },
    {"id": "medical-stop", "adapter": "medical", "prompt": "The doctor prescribed", "stop": [" for"]},
    {"id": "base-sampled", "prompt": "On Sunday morning we", "temperature": 0.7, "top_k": 20, "seed": 3},
]


def _openai(model: str, *, prompt: str | None = None, user: str | None = None, **body) -> dict:
    if prompt is not None:
        url, body = "/v1/completions", {"model": model, "prompt": prompt, **body}
    else:
        url, body = "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": user}], **body}
    return {"method": "POST", "url": url, "body": body}


_BATCH: list[dict] = [
    _openai("legal", prompt="Today I learned that", max_tokens=32),
    _openai("medical", prompt="Today I learned that", max_tokens=32),
    _openai("code", prompt="Today I learned that", max_tokens=32),
    _openai("base", prompt="The cat sat by the", max_tokens=32),
    _openai("code", prompt="def sort_items(", max_tokens=32),
    _openai("legal", user="Which law governs the contract?", max_tokens=48),
    _openai("medical", user="What is the treatment for asthma?", max_completion_tokens=48),
    _openai("code", user="How do I run the tests?", temperature=0.7, seed=1, max_tokens=48),
    _openai("code", user="Why do I get a KeyError?", max_tokens=48, stop=["."]),
    _openai("base", user="Where can I buy fresh bread?", max_tokens=48),
]
OPENAI_BATCH: list[dict] = [{"custom_id": f"req-{i}", **row} for i, row in enumerate(_BATCH, 1)]


def to_jsonl(rows: list[dict]) -> str:
    """One compact JSON object per line, in order."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
