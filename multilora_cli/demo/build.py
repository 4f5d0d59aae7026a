"""`build_demo`: a small trained Llama in Hugging Face layout, three PEFT adapters, and example inputs.

Offline and seeded. Layout of OUT:
    base/      config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json
    legal/ medical/ code/   adapter_config.json, adapter_model.safetensors (PEFT)
    prompts.jsonl, openai_batch.jsonl, .multilora-demo.json (marker written last: the build completed)
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from multilora_cli import __version__
from multilora_cli.demo import corpus, layout, prompts, tinyllama, tokenizer, train
from multilora_cli.errors import ConfigError, OutputError
from multilora_cli.models.config import LINEAR_MODULES

MARKER = ".multilora-demo.json"
FILES = ("base", "prompts.jsonl", "openai_batch.jsonl", MARKER)  # plus one folder per adapter


@dataclass(slots=True)
class AdapterSpec:
    """One demo adapter: its domain corpus, rank, alpha and PEFT target modules."""

    name: str
    r: int
    alpha: float
    targets: list[str]
    use_rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / (self.r**0.5 if self.use_rslora else self.r)


@dataclass(slots=True)
class DemoSpec:
    """Sizes and step counts of the demo. The defaults build in well under 30 s on 2 CPU cores."""

    seed: int = 0
    vocab_size: int = 1024
    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_len: int = 512
    seq_len: int = 64
    batch: int = 16
    base_steps: int = 200
    base_lr: float = 3e-3
    adapter_steps: int = 60
    adapter_lr: float = 1e-2
    lines_per_domain: int = 300
    chats_per_domain: int = 120
    max_new_tokens: int = 48
    # Fixed, since the bytes depend on the thread count. One thread: ~19 s on an idle 2-core machine; two: ~12 s
    # there, but each step ran 5x slower than one thread's when other work kept the cores busy (OpenMP spinning).
    threads: int = 1
    adapters: list[AdapterSpec] = field(
        default_factory=lambda: [
            AdapterSpec("legal", r=8, alpha=32, targets=["q_proj", "v_proj"]),
            AdapterSpec("medical", r=16, alpha=16, targets=["q_proj", "k_proj", "v_proj", "o_proj"], use_rslora=True),
            AdapterSpec("code", r=4, alpha=8, targets=list(LINEAR_MODULES)),
        ]
    )

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError("demo: hidden must divide by heads, and heads by kv_heads")
        for name in ("base_steps", "adapter_steps", "lines_per_domain", "chats_per_domain", "batch", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"demo: {name} must be >= 1, got {getattr(self, name)}")


def is_demo(out: Path) -> bool:
    """True when `out` holds a completed demo build of this version."""
    try:
        return json.loads((out / MARKER).read_text()).get("version") == __version__
    except (OSError, ValueError, AttributeError):
        return False


def _prepare(out: Path, force: bool, spec: DemoSpec) -> None:
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory", hint="choose another OUT_DIR")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputError(
            f"{out} is not empty", hint="pass --force to rebuild the demo there, or choose another OUT_DIR"
        )
    for name in (*FILES, *(a.name for a in spec.adapters)):  # --force replaces only the demo's own entries
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def build_demo(
    out: str | Path, *, force: bool = False, spec: DemoSpec | None = None, log: Callable[[str], None] = lambda s: None
) -> dict:
    """Build the demo into `out` and return a summary dict (sizes, losses, seconds, sample outputs).

    Raises OutputError if `out` is not empty (unless `force`)."""
    spec = spec or DemoSpec()
    out = Path(out)
    _prepare(out, force, spec)
    t0 = time.perf_counter()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        summary = _build(out, spec, log)
    finally:
        torch.set_num_threads(old_threads)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    layout.write_json(out / MARKER, {"version": __version__, "spec": asdict(spec)})
    return summary


def _build(out: Path, spec: DemoSpec, log: Callable[[str], None]) -> dict:
    t = time.perf_counter()
    # 1. corpus: plain sentences and chat pairs per domain
    plain = {d: corpus.plain_lines(d, spec.lines_per_domain, spec.seed) for d in corpus.DOMAINS}
    chats = {d: corpus.chat_pairs(d, spec.chats_per_domain, spec.seed) for d in corpus.DOMAINS}
    tok = tokenizer.train_tokenizer(
        [s for d in corpus.DOMAINS for s in plain[d]] + [s for d in corpus.DOMAINS for qa in chats[d] for s in qa],
        spec.vocab_size,
    )
    bos, eos, eot = (tok.token_to_id(s) for s in (tokenizer.BOS, tokenizer.EOS, tokenizer.EOT))

    def docs(domain: str) -> list[list[int]]:
        # plain: <bos> text <end_of_text>; chat: the template's rendering (bos included), turns end in <eot>
        ds = [[bos] + tok.encode(s, add_special_tokens=False).ids + [eos] for s in plain[domain]]
        for q, a in chats[domain]:
            text = tokenizer.render_chat([{"role": "user", "content": q}, {"role": "assistant", "content": a}], False)
            ds.append(tok.encode(text, add_special_tokens=False).ids)
        return ds

    log(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens ({time.perf_counter() - t:.1f} s)")

    # 2. base model: all four domains (it must guess the domain after a neutral opener)
    cfg = layout.llama_config(
        tok.get_vocab_size(),
        bos,
        [eos, eot],
        hidden=spec.hidden,
        intermediate=spec.intermediate,
        layers=spec.layers,
        heads=spec.heads,
        kv_heads=spec.kv_heads,
        max_len=spec.max_len,
    )
    base_docs = [d for dom in corpus.DOMAINS for d in docs(dom)]
    torch.manual_seed(spec.seed)
    w = tinyllama.init_weights(cfg, torch.Generator().manual_seed(spec.seed))
    base_log = train.train_base(
        w, cfg, train.Batches(base_docs, spec.batch, spec.seq_len, spec.seed), spec.base_steps, spec.base_lr
    )
    base_dir = out / "base"
    layout.write_base(base_dir, cfg, w, [eos, eot], spec.max_new_tokens)
    tokenizer.write_tokenizer(tok, base_dir, spec.max_len)
    log(
        f"base: Llama {spec.layers} layers, hidden {spec.hidden}, {sum(v.numel() for v in w.values()):,} params, "
        f"loss {base_log.first_loss:.2f} -> {base_log.last_loss:.2f} ({base_log.seconds:.1f} s)"
    )

    # 3. one LoRA per domain, trained on that domain only: it learns to stay in its domain
    summary: dict = {"base": asdict(base_log), "adapters": {}}
    loras = {}
    for i, a in enumerate(spec.adapters):
        batches = train.Batches(docs(a.name), spec.batch, spec.seq_len, spec.seed + 1 + i)
        lora, alog = train.train_lora(
            w, cfg, a.targets, a.r, a.scaling, batches, spec.adapter_steps, spec.adapter_lr, spec.seed + 100 + i
        )
        layout.write_adapter(
            out / a.name, base_dir, lora, r=a.r, alpha=a.alpha, targets=a.targets, use_rslora=a.use_rslora
        )
        loras[a.name] = lora
        summary["adapters"][a.name] = asdict(alog)
        log(
            f"{a.name}: LoRA r={a.r} on {','.join(a.targets)}{' (rsLoRA)' if a.use_rslora else ''}, "
            f"loss {alog.first_loss:.2f} -> {alog.last_loss:.2f} ({alog.seconds:.1f} s)"
        )

    # 4. example inputs, and one greedy continuation per adapter as a sanity check
    (out / "prompts.jsonl").write_text(prompts.to_jsonl(prompts.PROMPTS))
    (out / "openai_batch.jsonl").write_text(prompts.to_jsonl(prompts.OPENAI_BATCH))
    probe = "Here is one example:"
    ids = tok.encode(probe).ids
    samples = {}
    for name, lora in [("base", None), *loras.items()]:
        gen = train.greedy(w, cfg, ids, 24, {eos, eot}, lora)
        samples[name] = probe + tok.decode(gen, skip_special_tokens=True)
    summary["samples"] = samples
    return summary
