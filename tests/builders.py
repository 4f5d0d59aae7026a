"""Build tiny real models and adapters for tests: transformers writes the base, PEFT writes adapters.

PEFT initialises lora_B to zero (a no-op adapter), so every builder randomises lora_B before saving.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ARCHS = ["llama", "llama-tied", "llama3", "mistral", "qwen2", "qwen3"]  # every arch tiny_config builds

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)


def tiny_config(arch: str = "llama", **overrides):
    """A transformers config for a tiny model of `arch` in {llama, llama-tied, llama3, mistral, qwen2, qwen3}."""
    import transformers as tf

    kw = dict(TINY)
    if arch in ("llama", "llama-tied", "llama3"):
        kw["tie_word_embeddings"] = arch == "llama-tied"
        if arch == "llama3":
            kw["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
            kw["rope_theta"] = 500000.0
        cfg = tf.LlamaConfig(**{**kw, **overrides})
    elif arch == "mistral":
        cfg = tf.MistralConfig(**{**kw, "sliding_window": None, **overrides})
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**{**kw, "tie_word_embeddings": True, **overrides})
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**{**kw, "head_dim": 32, "tie_word_embeddings": False, **overrides})
    else:
        raise ValueError(arch)
    return cfg


def build_base(path: Path, arch: str = "llama", seed: int = 0, dtype=torch.float32, **overrides) -> Path:
    """Write a random tiny HF model of `arch` to `path` (config.json + model.safetensors)."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_config(arch, **overrides)
    model = tf.AutoModelForCausalLM.from_config(cfg).to(dtype)
    with torch.no_grad():  # HF init is small; widen it so adapters and positions visibly matter
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    return Path(path)


def build_adapter(
    base_path: Path,
    out: Path,
    *,
    r: int = 8,
    alpha: float = 16,
    targets=("q_proj", "v_proj"),
    seed: int = 1,
    safetensors: bool = True,
    **lora_kw,
) -> Path:
    """Write a real PEFT LoRA adapter for the model at `base_path` with random lora_A and lora_B."""
    import peft
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    cfg = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=list(targets) if not isinstance(targets, str) else targets,
        lora_dropout=0.0,
        **lora_kw,
    )
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name or "lora_A" in name:
                p.normal_(0, 0.1)
    pm.save_pretrained(out, safe_serialization=safetensors)
    # base_model_name_or_path as written by PEFT is the local path; keep it.
    return Path(out)


def read_json(p: Path) -> dict:
    return json.loads(Path(p).read_text())


def build_tokenizer(path: Path, vocab_size: int = 256) -> Path:
    """Write a word-level tokenizer.json (+ tokenizer_config.json) covering `vocab_size` ids.

    Ids 0-2 are <unk>, <s>, </s> (Llama's tiny-config bos/eos); the rest are words "w3".."wN", so any id
    sequence decodes to text and back. Good enough for engine tests that feed prompt_token_ids.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}",
            }
        )
    )
    return path


MIXED_ADAPTERS = {  # name -> build_adapter kwargs: different ranks, targets, rsLoRA, rank_pattern
    "qv8": dict(r=8, alpha=16, targets=("q_proj", "v_proj"), seed=11),
    "all4rs": dict(r=4, alpha=8, targets="all-linear", use_rslora=True, seed=12),
    "mlp16": dict(r=16, alpha=32, targets=("o_proj", "up_proj", "down_proj"), rank_pattern={"down_proj": 2}, seed=13),
}


def build_mixed(root: Path, arch: str = "llama") -> tuple[Path, dict[str, Path]]:
    """A tiny base of `arch` with a tokenizer, and the three MIXED_ADAPTERS written by PEFT beside it."""
    root = Path(root)
    base = build_base(root / "base", arch)
    build_tokenizer(base)
    return base, {n: build_adapter(base, root / n, **kw) for n, kw in MIXED_ADAPTERS.items()}


def load_peft(base: Path, adapters: dict[str, Path]):
    """The HF reference: `base` in fp32 with every adapter of `adapters` loaded into one PeftModel (eval mode)."""
    import peft
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    names = list(adapters)
    pm = peft.PeftModel.from_pretrained(model, adapters[names[0]], adapter_name=names[0])
    for n in names[1:]:
        pm.load_adapter(adapters[n], adapter_name=n)
    return pm.eval()
