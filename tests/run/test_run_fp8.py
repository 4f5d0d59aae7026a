"""`multilora run` on FP8 bases, through the whole pipeline (pre-flight, tokenizer, writer), greedy fp32 on CPU with
PEFT-written adapters on top:
- a weight-only FP8 checkpoint gives, line by line, what HF + PEFT `generate` give on its dequantized weights;
- `--quantization fp8` on the unquantized base gives exactly what its llm-compressor FP8-dynamic checkpoint gives;
- a mixed-adapter batch gives each line what that line alone gives (activations quantized per token)."""

from __future__ import annotations

import pytest

from tests.builders import build_mixed
from tests.models import fp8_checkpoints as ckpt
from tests.run.helpers import read_jsonl, run_cli, write_jsonl
from tests.run.test_run_peft import ADAPTERS, NEW, PROMPTS, hf_generate

LINES = [
    {"id": f"{a or 'base'}-{i}", "prompt": p, **({"adapter": a} if a else {})}
    for i, p in enumerate(PROMPTS)
    for a in ADAPTERS
]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8_run")
    base, adapters = build_mixed(root / "src", "llama")
    weight_only = ckpt.compressed_tensors(base, root / "w8a16", activations="none")
    dynamic = ckpt.compressed_tensors(base, root / "fp8-dynamic", activations="dynamic")
    return base, adapters, weight_only, dynamic


def _run(tmp_path, model, adapters, lines, *flags) -> list[tuple[str, int]]:
    inp, out = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    adapter_flags = [x for name, path in adapters.items() for x in ("-a", f"{name}={path}")]
    rc, _, err = run_cli(
        ["run", str(inp), "-m", str(model), *adapter_flags, "-o", str(out), *flags]
        + ["--device", "cpu", "--dtype", "float32", "--temperature", "0", "--max-tokens", str(NEW), "-q"]
    )
    assert rc == 0, err
    records = read_jsonl(out)
    assert [r["id"] for r in records] == [line["id"] for line in lines]
    return [(r["text"], r["usage"]["completion_tokens"]) for r in records]


def test_weight_only_fp8_checkpoint_gives_hf_peft_tokens_on_its_dequantized_weights(mixed, tmp_path):
    _, adapters, weight_only, _ = mixed
    want = hf_generate(ckpt.dequantized(weight_only, tmp_path / "deq"), adapters, LINES)
    assert _run(tmp_path, weight_only, adapters, LINES) == want


def test_quantization_flag_equals_the_fp8_dynamic_checkpoint(mixed, tmp_path):
    base, adapters, _, dynamic = mixed
    online = _run(tmp_path, base, adapters, LINES, "--quantization", "fp8")
    assert online == _run(tmp_path, dynamic, adapters, LINES)


def test_mixed_batch_equals_each_line_alone(mixed, tmp_path):
    _, adapters, _, dynamic = mixed
    lines = LINES[: len(ADAPTERS)]  # one prompt, every adapter and the base
    together = _run(tmp_path, dynamic, adapters, lines)
    assert together == [_run(tmp_path, dynamic, adapters, [line])[0] for line in lines]


def test_a_dora_adapter_on_an_fp8_base_fails_its_own_lines(mixed, tmp_path):
    """DoRA's norms need the unquantized base weights: on an FP8 base (flag or checkpoint) a DoRA adapter fails
    pre-flight and its lines get error records; the other adapters' lines run (exit 3)."""
    from tests.builders import build_adapter

    base, adapters, _, dynamic = mixed
    dora = build_adapter(base, tmp_path / "dora", r=4, alpha=8, targets=("q_proj", "v_proj"), use_dora=True, seed=5)
    name = next(iter(adapters))
    lines = [{"id": "d", "prompt": PROMPTS[0], "adapter": "dora"}, {"id": "p", "prompt": PROMPTS[0], "adapter": name}]
    for model, flags in ((dynamic, []), (base, ["--quantization", "fp8"])):
        inp, out = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
        rc, _, err = run_cli(
            ["run", str(inp), "-m", str(model), "-a", f"dora={dora}", "-a", f"{name}={adapters[name]}", "-o", str(out)]
            + [*flags, "--device", "cpu", "--dtype", "float32", "--max-tokens", "2", "-q"]
        )
        got = {r["id"]: r for r in read_jsonl(out)}
        assert rc == 3 and "DoRA, which is not served on an FP8 base" in err, err
        assert "error" in got["d"] and "error" not in got["p"]
