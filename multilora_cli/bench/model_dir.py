"""A model directory the engine can open for a shape preset: config.json + a word-level tokenizer, no weights.

The engine runs it with `load_format="dummy"` (random weights). Presets are the published config.json
values of economics.presets, plus "tiny" (CPU tests, smoke runs).
"""

from __future__ import annotations

import json
from pathlib import Path

from multilora_cli.economics.presets import MODEL_PRESETS
from multilora_cli.errors import UsageError

TINY = dict(
    _name_or_path="multilora/tiny-random",
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=2048,
)
PRESETS: dict[str, dict] = {**MODEL_PRESETS, "tiny": TINY}


def preset_config(name: str) -> dict:
    """The HF config dict of a preset (raises UsageError naming the known ones)."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise UsageError(f"unknown model preset {name!r}", hint=f"choose one of {', '.join(sorted(PRESETS))}")
    return {**PRESETS[key], "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}


def write_model_dir(preset: str, path: Path) -> Path:
    """Write config.json, tokenizer.json and tokenizer_config.json for `preset` into `path`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    cfg = preset_config(preset)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, cfg["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    return path
