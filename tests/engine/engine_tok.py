"""Build real tokenizer directories for tests: a byte-level BPE trained with `tokenizers` on a small text,
saved as tokenizer.json + tokenizer_config.json (+ config / generation_config) like a HF model directory."""

from __future__ import annotations

import json
from pathlib import Path

TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Multi-LoRA serving batches many adapters over one base model.",
    "héllo wörld, ça va? naïve café — 東京 你好 こんにちは 🌍🚀",
    "def add(a, b):\n    return a + b\n",
    "Stop here: ### END ### and continue <tag> after.",
    "system user assistant content role message prompt",
]

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

CHATML_TEMPLATE = (
    "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('roles must be system/user/assistant') }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{{ message['content'] | tojson }}"
    "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
]
CHATML_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train(special: list[str], metaspace: bool = False, vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    if metaspace:  # SentencePiece-style: "▁" marks spaces, the decoder drops the first one
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = []
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    tk.train_from_iterator(TEXT, trainer)
    return tk


def write_llama3_dir(d: Path, *, template_in_jinja: bool = False, add_bos_token=None) -> Path:
    """Llama-3-like: BOS added by the post-processor, template emits BOS too, eos ids spread over 3 files."""
    from tokenizers import processors

    d.mkdir(parents=True, exist_ok=True)
    tk = train(LLAMA3_SPECIAL)
    bos = tk.token_to_id("<|begin_of_text|>")
    tk.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    tk.save(str(d / "tokenizer.json"))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "added_tokens_decoder": {
            str(tk.token_to_id(t)): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for t in LLAMA3_SPECIAL
        },
    }
    if add_bos_token is not None:
        tc["add_bos_token"] = add_bos_token
    if template_in_jinja:
        (d / "chat_template.jinja").write_text(LLAMA3_TEMPLATE)
        tc["chat_template"] = "IGNORED {{ messages }}"  # the .jinja file wins
    else:
        tc["chat_template"] = LLAMA3_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    (d / "config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": tk.token_to_id("<|end_of_text|>")}))
    (d / "generation_config.json").write_text(
        json.dumps(
            {"eos_token_id": [tk.token_to_id("<|eom_id|>")], "do_sample": True, "temperature": 0.6, "top_p": 0.9}
        )
    )
    return d


def write_chatml_dir(d: Path, *, with_template: bool = True, metaspace: bool = False) -> Path:
    """Qwen-like: no BOS at all, ChatML template; optional SentencePiece-style (Metaspace) model."""
    d.mkdir(parents=True, exist_ok=True)
    tk = train(CHATML_SPECIAL, metaspace=metaspace)
    tk.save(str(d / "tokenizer.json"))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
    }
    if with_template:
        tc["chat_template"] = CHATML_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    (d / "config.json").write_text(json.dumps({"eos_token_id": tk.token_to_id("<|endoftext|>")}))
    return d
