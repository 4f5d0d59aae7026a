"""`multilora demo`: the files are real (transformers loads the base, peft loads the adapters), the model was
trained (low loss, adapters change the text), the build is deterministic, and README's commands hold."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from multilora_cli.cli import main
from multilora_cli.demo import build as demo_build
from multilora_cli.demo import corpus, prompts, tinyllama, tokenizer
from multilora_cli.demo.build import DemoSpec, build_demo, is_demo
from multilora_cli.errors import OutputError

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("legal", "medical", "code")
TINY = dict(base_steps=3, adapter_steps=2, lines_per_domain=40, chats_per_domain=12, vocab_size=512)


def readme_commands() -> tuple[str, str]:
    """The two set-up commands: the lines after `# 1. ` and `# 2. ` in README's first bash block."""
    lines = (ROOT / "README.md").read_text().splitlines()
    one = lines[[i for i, s in enumerate(lines) if s.startswith("# 1. ")][0] + 1]
    two = lines[[i for i, s in enumerate(lines) if s.startswith("# 2. ")][0] + 1]
    return one, two


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    return e.value.code or 0, out, err


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The full demo, built once through the CLI as README's command 1 does."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    with pytest.raises(SystemExit) as e:
        main(["demo", str(out)])
    assert e.value.code == 0
    return out


@pytest.fixture(scope="module")
def hf_base(demo):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(demo / "base", dtype=torch.float32).eval()
    tok = tf.AutoTokenizer.from_pretrained(demo / "base")
    return model, tok


def _peft(demo: Path, name: str):
    import peft
    import transformers as tf

    base = tf.AutoModelForCausalLM.from_pretrained(demo / "base", dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, demo / name).eval()


def _lora_from_files(adapter_dir: Path) -> tinyllama.LoraParams:
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    scaling = cfg["lora_alpha"] / (cfg["r"] ** 0.5 if cfg["use_rslora"] else cfg["r"])
    with safe_open(adapter_dir / "adapter_model.safetensors", "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    pre, suf = "base_model.model.", ".lora_A.weight"
    return {k[len(pre) : -len(suf)]: (t[k], t[k.replace("lora_A", "lora_B")], scaling) for k in t if k.endswith(suf)}


@pytest.mark.slow  # the demo fixture builds and trains the full demo once (the slowest CPU setup)
def test_layout_is_hugging_face_and_peft(demo):
    base = demo / "base"
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (base / f).is_file(), f
    cfg = json.loads((base / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["torch_dtype"] == "float32" and cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    gen = json.loads((base / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["max_new_tokens"] > 0 and len(gen["eos_token_id"]) == 2
    with safe_open(base / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert {
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight",
        f"model.layers.{cfg['num_hidden_layers'] - 1}.mlp.down_proj.weight",
    } <= keys
    ranks = set()
    for spec in DemoSpec().adapters:
        acfg = json.loads((demo / spec.name / "adapter_config.json").read_text())
        assert acfg["peft_type"] == "LORA" and acfg["bias"] == "none" and acfg["task_type"] == "CAUSAL_LM"
        assert acfg["base_model_name_or_path"] == str(base.resolve())
        assert (acfg["r"], acfg["target_modules"], acfg["use_rslora"]) == (spec.r, spec.targets, spec.use_rslora)
        ranks.add(acfg["r"])
        with safe_open(demo / spec.name / "adapter_model.safetensors", "pt") as f:
            keys = list(f.keys())
            assert len(keys) == 2 * len(spec.targets) * cfg["num_hidden_layers"]
            a = f.get_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
            b = f.get_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
        assert a.shape == (spec.r, cfg["hidden_size"]) and b.shape == (cfg["hidden_size"], spec.r)
        assert b.abs().max() > 0  # trained, not PEFT's zero init
    assert len(ranks) == 3


@pytest.mark.slow
def test_inputs_are_copied_and_match_examples(demo):
    for name in ("prompts.jsonl", "openai_batch.jsonl"):
        assert (demo / name).read_text() == (ROOT / "examples" / name).read_text(), name
    rows = [json.loads(s) for s in (demo / "prompts.jsonl").read_text().splitlines()]
    adapters = {r.get("adapter") for r in rows}
    assert adapters == {"legal", "medical", None, "base"}  # README's command passes only legal,medical
    assert any("messages" in r for r in rows) and any("prompt" in r for r in rows)
    assert any("temperature" in r and "seed" in r for r in rows) and any("stop" in r for r in rows)
    batch = [json.loads(s) for s in (demo / "openai_batch.jsonl").read_text().splitlines()]
    assert {b["url"] for b in batch} == {"/v1/completions", "/v1/chat/completions"}
    assert {b["body"]["model"] for b in batch} == {"legal", "medical", "code", "base"}
    assert all(b["method"] == "POST" for b in batch) and len({b["custom_id"] for b in batch}) == len(batch)


@pytest.mark.slow
def test_transformers_loads_the_tokenizer_and_chat_template(demo, hf_base):
    _, tok = hf_base
    msgs = [{"role": "user", "content": "Give me an example."}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == tokenizer.render_chat(msgs, add_generation_prompt=True)
    assert text.startswith(tokenizer.BOS) and text.endswith("<|end_header_id|>\n\n")
    ids = tok("In short, the patient")["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids(tokenizer.BOS)
    assert tok.decode(ids, skip_special_tokens=True) == "In short, the patient"


@pytest.mark.slow
def test_base_matches_transformers_and_was_trained(demo, hf_base):
    model, tok = hf_base
    from safetensors.torch import load_file

    w = load_file(demo / "base" / "model.safetensors")
    cfg = json.loads((demo / "base" / "config.json").read_text())
    lines = [s for d in corpus.DOMAINS for s in corpus.plain_lines(d, 8, seed=12345)]  # fresh fills
    ids = [tok(s)["input_ids"] + [tok.convert_tokens_to_ids(tokenizer.EOS)] for s in lines]
    losses = []
    with torch.no_grad():
        for seq in ids:
            x = torch.tensor([seq])
            ours = tinyllama.forward(w, cfg, x)
            theirs = model(x).logits
            torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)
            losses.append(torch.nn.functional.cross_entropy(theirs[0, :-1], x[0, 1:]).item())
    mean = sum(losses) / len(losses)
    random_loss = torch.log(torch.tensor(float(cfg["vocab_size"]))).item()
    assert mean < 1.5, f"base model barely trained: {mean:.2f} nats/token (random: {random_loss:.1f})"


@pytest.mark.slow
def test_peft_loads_each_adapter_and_it_changes_the_output(demo, hf_base):
    base, tok = hf_base
    from safetensors.torch import load_file

    w = load_file(demo / "base" / "model.safetensors")
    cfg = json.loads((demo / "base" / "config.json").read_text())
    eos = [tok.convert_tokens_to_ids(t) for t in (tokenizer.EOS, tokenizer.EOT)]
    probes = [
        r.get("prompt") or tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
        for r in prompts.PROMPTS
    ]
    encoded = [tok(p, add_special_tokens=not p.startswith(tokenizer.BOS))["input_ids"] for p in probes]

    def greedy(model) -> list[str]:
        outs = []
        for seq in encoded:
            g = model.generate(
                input_ids=torch.tensor([seq]), max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=eos[0]
            )
            outs.append(tok.decode(g[0, len(seq) :], skip_special_tokens=True))
        return outs

    with torch.no_grad():
        base_text = greedy(base)
        x = torch.tensor([encoded[0]])
        base_logits = base(x).logits
        texts = {}
        for name in NAMES:
            pm = _peft(demo, name)
            spec = next(s for s in DemoSpec().adapters if s.name == name)
            assert pm.peft_config["default"].r == spec.r
            logits = pm(x).logits
            assert (logits - base_logits).abs().max() > 0.1, name
            ours = tinyllama.forward(w, cfg, x, _lora_from_files(demo / name))  # same math as PEFT
            torch.testing.assert_close(ours, logits, atol=2e-4, rtol=1e-4)
            texts[name] = greedy(pm)
    for name in NAMES:
        changed = sum(a != b for a, b in zip(texts[name], base_text))
        assert changed >= 3, f"{name} changes only {changed} of {len(base_text)} greedy continuations"
    assert texts["legal"] != texts["medical"] != texts["code"]


def test_build_is_deterministic(tmp_path):
    spec = DemoSpec(**TINY)

    def digests(root: Path) -> dict[str, str]:
        out = {}
        for p in sorted(root.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                if p.name == "adapter_config.json":  # holds the absolute base path: compare the rest
                    cfg = json.loads(data)
                    cfg.pop("base_model_name_or_path")
                    data = json.dumps(cfg, sort_keys=True).encode()
                out[str(p.relative_to(root))] = hashlib.sha256(data).hexdigest()
        return out

    build_demo(tmp_path / "a", spec=spec)
    build_demo(tmp_path / "b", spec=spec)
    a, b = digests(tmp_path / "a"), digests(tmp_path / "b")
    assert len(a) >= 12 and a == b


@pytest.mark.slow
def test_existing_dirs(demo, tmp_path, capsys):
    code, out, _ = call(["demo", str(demo)], capsys)  # a finished demo is not rebuilt
    assert code == 0 and "already built" in out
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    code, _, err = call(["demo", str(other)], capsys)
    assert code == OutputError.exit_code and "not empty" in err and "--force" in err
    assert not is_demo(other)
    build_demo(other, force=True, spec=DemoSpec(**TINY))  # --force replaces only the demo's own entries
    assert is_demo(other) and (other / "notes.txt").read_text() == "keep me"
    assert demo_build.MARKER in {p.name for p in other.iterdir()}


def test_make_demo_wrapper_is_the_command():
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_demo.py"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "--force" in p.stdout and "OUT_DIR" in p.stdout.upper()


def test_ci_runs_readme_test_command_verbatim():
    _, two = readme_commands()
    p = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run"), "--print-command"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n") == two
    assert "pip install torch==2.13.0" in two and "'.[test]'" in two and "TRITON_INTERPRET=1 python -m pytest" in two


@pytest.mark.slow
def test_readme_command_one_runs_on_the_demo(demo, capsys, monkeypatch):
    """README command 1's `(cd demo && multilora run ...)`, in-process, on the demo built above. The run is in a
    subshell, so the shell stays where it was and command 2 can be typed next."""
    one, _ = readme_commands()
    assert " && multilora demo demo && (cd demo && " in one and one.endswith(")")
    tail = one.split(" && (cd demo && ", 1)[1][:-1]
    argv = shlex.split(tail)
    assert argv[:2] == ["multilora", "run"]
    names = argv[argv.index("--adapters") + 1].split(",")
    rows = [json.loads(s) for s in (demo / "prompts.jsonl").read_text().splitlines()]
    assert {r.get("adapter") for r in rows} - {None, "base"} <= set(names)
    monkeypatch.chdir(demo)
    (demo / "stats.json").unlink(missing_ok=True)
    code, out, err = call(argv[1:], capsys)
    assert code == 0, err
    results = [json.loads(s) for s in out.splitlines()]
    assert [r["id"] for r in results] == [r["id"] for r in rows]
    assert all(r.get("text") and r["finish_reason"] in ("stop", "length") for r in results)
    stats = json.loads((demo / "stats.json").read_text())
    assert stats["requests"] == len(rows) and stats["errors"] == 0
    by_id = {r["id"]: r["text"] for r in results}
    assert len({by_id["legal-1"], by_id["medical-1"], by_id["base-1"]}) >= 2  # adapters change the text
