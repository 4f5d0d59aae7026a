"""The demo tokenizer: byte-level BPE trained with `tokenizers`, Llama-3-style special tokens and chat template.

Plain documents are `<|begin_of_text|> text <|end_of_text|>`; chat documents are rendered by CHAT_TEMPLATE
(which writes the bos itself, like Llama 3) and end each turn with `<|eot_id|>`. Both end tokens are eos.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT]

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def train_tokenizer(lines: list[str], vocab_size: int):
    """Train a byte-level BPE `tokenizers.Tokenizer` on `lines`; the specials get ids 0..4."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    # Encoding with add_special_tokens=True prepends bos (as Llama 3's tokenizer does).
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
            ),
        ]
    )
    return tok


@lru_cache(maxsize=1)
def _template():
    import jinja2

    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)


def render_chat(messages: list[dict], add_generation_prompt: bool) -> str:
    """Render `messages` with CHAT_TEMPLATE, as transformers' apply_chat_template would."""
    return _template().render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=BOS, eos_token=EOS
    )


def write_tokenizer(tok, out: Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) into `out`."""
    tok.save(str(out / "tokenizer.json"), pretty=False)
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": EOS,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOT, "pad_token": EOS}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
