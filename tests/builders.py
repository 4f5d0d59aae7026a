"""Build tiny real models and adapters for tests: transformers writes the base, PEFT writes adapters.

PEFT initialises lora_B (an embedding LoRA: lora_embedding_A) to zero (a no-op adapter), so every builder randomises
both factors before saving, and perturbs modules_to_save copies (else equal to the base's); a DoRA
adapter (use_dora=True) also gets its magnitudes scaled by random factors in [0.5, 1.5], so m != ||W + s·B·A||.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ARCHS = [  # every arch tiny_config builds
    "llama",
    "llama-tied",
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "phi3-longrope",
]
# the new families' tiny shapes make each feature visible: a 5-token window (prompts run past it), head_dim 32
# apart from hidden / heads, a query_pre_attn_scalar that is not head_dim, soft caps near the logits' scale,
# LongRoPE switching to its long factors at position 12 with a half-size rotary dimension
GEMMA = dict(
    head_dim=32,
    query_pre_attn_scalar=24,
    sliding_window=5,
    layer_types=["sliding_attention", "full_attention"],
    bos_token_id=1,
    eos_token_id=2,
)
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.3, 1.9, 2.5],
    "long_factor": [1.5, 3.0, 6.0, 12.0],
    "original_max_position_embeddings": 12,
}

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
    """A transformers config for a tiny model of `arch` (one of ARCHS)."""
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
    elif arch == "gemma2":
        caps = dict(attn_logit_softcapping=1.5, final_logit_softcapping=2.0)
        cfg = tf.Gemma2Config(**{**kw, **GEMMA, **caps, **overrides})
    elif arch == "gemma3":
        rope = {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
        cfg = tf.Gemma3TextConfig(**{**kw, **GEMMA, "rope_parameters": rope, **overrides})
    elif arch == "phi3":
        extra = dict(sliding_window=7, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        cfg = tf.Phi3Config(**{**kw, **extra, **overrides})
    elif arch == "phi3-longrope":
        rope = {**LONGROPE, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        extra = dict(rope_parameters=rope, original_max_position_embeddings=12, bos_token_id=1, eos_token_id=2)
        extra["pad_token_id"] = 0
        cfg = tf.Phi3Config(**{**kw, **extra, **overrides})
    else:
        raise ValueError(arch)
    return cfg


def hf_model(path: Path, dtype: torch.dtype = torch.float32):
    """The HF reference model at `path` (eval mode) with transformers' eager attention: the reference semantics.
    transformers before 5.2x defaulted Gemma 2 to SDPA, which drops attention soft-capping without a word (its
    logits then differ from eager's by ~0.1 on the tiny model); eager applies it everywhere."""
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()


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

    torch.manual_seed(seed)
    model = hf_model(base_path)
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
            if "lora_B" in name or "lora_A" in name or "lora_embedding_" in name:
                p.normal_(0, 0.1)
            elif "modules_to_save" in name:  # a trained copy of embed_tokens / lm_head: not the base's any more
                p.add_(torch.empty_like(p).normal_(0, 0.05))
            elif "lora_magnitude_vector" in name:
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
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
                # tokenizer.json as it is (the model type's own tokenizer class, e.g. Gemma's in transformers 5,
                # would rebuild its pipeline and split these words differently)
                "tokenizer_class": "PreTrainedTokenizerFast",
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


def mixed_adapters(arch: str) -> dict[str, dict]:
    """MIXED_ADAPTERS for the Llama family; for Gemma and Phi-3 the same three kinds (Phi-3 naming its fused
    qkv_proj / gate_up_proj), the q/v one also restricted to layer 1 (layers_to_transform)."""
    if not arch.startswith(("gemma", "phi3")):
        return MIXED_ADAPTERS
    phi = arch.startswith("phi3")
    return {
        "qv8": dict(
            r=8, alpha=16, targets=("qkv_proj",) if phi else ("q_proj", "v_proj"), layers_to_transform=[1], seed=11
        ),
        "all4rs": dict(r=4, alpha=8, targets="all-linear", use_rslora=True, seed=12),
        "mlp16": dict(
            r=16,
            alpha=32,
            targets=("o_proj", "gate_up_proj" if phi else "up_proj", "down_proj"),
            rank_pattern={"down_proj": 2},
            seed=13,
        ),
    }


def build_mixed(root: Path, arch: str = "llama") -> tuple[Path, dict[str, Path]]:
    """A tiny base of `arch` with a tokenizer, and its three `mixed_adapters` written by PEFT beside it."""
    root = Path(root)
    base = build_base(root / "base", arch)
    build_tokenizer(base)
    return base, {n: build_adapter(base, root / n, **kw) for n, kw in mixed_adapters(arch).items()}


def load_peft(base: Path, adapters: dict[str, Path]):
    """The HF reference: `base` in fp32 with every adapter of `adapters` loaded into one PeftModel (eval mode)."""
    import peft

    model = hf_model(base)
    names = list(adapters)
    pm = peft.PeftModel.from_pretrained(model, adapters[names[0]], adapter_name=names[0])
    for n in names[1:]:
        pm.load_adapter(adapters[n], adapter_name=n)
    return pm.eval()


def hf_greedy_margins(base: Path, adapters: dict[str, Path], prompts, plan, new: int):
    """HF + PEFT fp32 greedy continuations of `prompts` (each under its `plan` adapter, None: the base) for `new`
    tokens, with each step's top-1 margin (top logit minus the second): where a bf16 comparison may part ways."""
    import torch

    pm = load_peft(base, adapters)
    tokens, margins = [], []
    with torch.no_grad():
        for p, a in zip(prompts, plan):
            ids, marg = torch.tensor([p]), []
            for _ in range(new):
                if a is None:
                    with pm.disable_adapter():
                        logits = pm(input_ids=ids).logits[0, -1]
                else:
                    pm.set_adapter(a)
                    logits = pm(input_ids=ids).logits[0, -1]
                top = logits.topk(2).values
                marg.append(float(top[0] - top[1]))
                ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
            tokens.append(ids[0, len(p) :].tolist())
            margins.append(marg)
    return tokens, margins
