"""`multilora run` on adapters written by PEFT itself (the other run tests use the demo's writer): a tiny Llama saved
by transformers, three adapters saved by `PeftModel.save_pretrained` (q/v rank 8; all-linear rsLoRA rank 4;
o/up/down rank 16 with a rank_pattern), random lora_A and lora_B. Greedy fp32 on CPU: every line's completion is
the one HF + PEFT `generate` gives for the same prompt and adapter (or the base). Also on Gemma 2 / Gemma 3 bases
and Phi-3 with LongRoPE (whose adapters are PEFT's on the fused qkv_proj / gate_up_proj; its completions run past
the LongRoPE switch at position 12), through the whole pipeline (pre-flight, tokenizer, writer)."""

from __future__ import annotations

import pytest
import torch

from tests.builders import build_mixed, load_peft
from tests.run.helpers import read_jsonl, run_cli, write_jsonl

NEW = 8
PROMPTS = ["w5 w17 w42 w8", "w200 w3 w3 w91 w64 w12 w7", "w150"]
ADAPTERS = [None, "qv8", "all4rs", "mlp16"]


@pytest.fixture(scope="module", params=["llama", "gemma2", "gemma3", "phi3-longrope"])
def mixed(tmp_path_factory, request):
    return build_mixed(tmp_path_factory.mktemp("peft_mixed"), request.param)


def hf_generate(base, adapters, lines) -> list[tuple[str, int]]:
    """(text, completion tokens) per line from HF + PEFT greedy `generate` (stops at eos as the run does)."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(base)
    pm = load_peft(base, adapters)
    out = []
    with torch.no_grad():
        for line in lines:
            ids = tok(line["prompt"], return_tensors="pt").input_ids
            kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=tok.eos_token_id)
            if line.get("adapter") is None:
                with pm.disable_adapter():
                    gen = pm.generate(input_ids=ids, **kw)[0, ids.shape[1] :]
            else:
                pm.set_adapter(line["adapter"])
                gen = pm.generate(input_ids=ids, **kw)[0, ids.shape[1] :]
            out.append((tok.decode(gen, skip_special_tokens=True), len(gen)))
    return out


def test_peft_written_adapters_give_hf_peft_tokens(mixed, tmp_path):
    base, adapters = mixed
    lines = [
        {"id": f"{a or 'base'}-{i}", "prompt": p, **({"adapter": a} if a else {})}
        for i, p in enumerate(PROMPTS)
        for a in ADAPTERS
    ]
    inp, out = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    adapter_flags = [x for name, path in adapters.items() for x in ("-a", f"{name}={path}")]
    rc, _, err = run_cli(
        ["run", str(inp), "-m", str(base), *adapter_flags, "-o", str(out)]
        + ["--device", "cpu", "--dtype", "float32", "--temperature", "0", "--max-tokens", str(NEW), "-q"]
    )
    assert rc == 0, err
    records = read_jsonl(out)
    assert [r["id"] for r in records] == [line["id"] for line in lines]
    want = hf_generate(base, adapters, lines)
    got = [(r["text"], r["usage"]["completion_tokens"]) for r in records]
    assert got == want
    # the adapters were applied: on some prompt every adapter's completion differs from the base's
    texts = {(r["id"].split("-")[0], r["id"].split("-")[1]): r["text"] for r in records}
    assert all(any(texts[a, str(i)] != texts["base", str(i)] for i in range(len(PROMPTS))) for a in ADAPTERS[1:])
