"""`multilora run` end to end on a real tiny model and real adapters, through the CLI entry point (in-process).

Every bad input of the contract sits in ONE file beside good lines: each bad line gets exactly one clear error
record, every other line still gets its completion, in input order.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.run.helpers import read_jsonl, run_cli, write_jsonl

LONG = "the court held that the tenant shall pay " * 40  # far beyond --max-model-len 96


@pytest.fixture(scope="module")
def broken_adapter(model_dir, tmp_path_factory):
    """A real adapter that pre-flight rejects (a LoRA bias, lora_bias=true, is not servable)."""
    p = tmp_path_factory.mktemp("broken") / "biased"
    shutil.copytree(model_dir / "legal", p)
    cfg = json.loads((p / "adapter_config.json").read_text())
    cfg["lora_bias"] = True
    (p / "adapter_config.json").write_text(json.dumps(cfg))
    return p


def adapters_args(model_dir, *extra):
    return [
        "-m",
        str(model_dir / "base"),
        "--adapter-dir",
        str(model_dir),
        "--device",
        "cpu",
        "--max-model-len",
        "96",
        *extra,
    ]


GOOD = [
    {"id": "base-1", "prompt": "The court held that"},
    {"id": "legal-1", "prompt": "The court held that", "adapter": "legal"},
    {"id": "med-1", "prompt": "The patient presented with", "adapter": "medical", "max_tokens": 4},
    {"id": "code-1", "messages": [{"role": "user", "content": "How do I run the tests?"}], "adapter": "code"},
    {"id": "alias-1", "prompt": "The court held that", "adapter": "base"},
    {"prompt": "The weather today is", "adapter": "legal", "stop": ["e"]},
]


def bad_lines():
    """(raw line, expected error code) for every kind of bad line of the contract."""
    return [
        (b'{"id": "m1", "prompt": "x"', "invalid_json"),
        (b"[1, 2, 3]", "invalid_json"),
        (b'{"id": "np"}', "missing_prompt"),
        (b'{"id": "both", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "invalid_request"),
        (b'{"id": "mt", "prompt": "a", "max_tokens": "ten"}', "invalid_sampling"),
        (b'{"id": "tm", "prompt": "a", "temperature": -1}', "invalid_sampling"),
        (b'{"id": "tp", "prompt": "a", "top_p": 2}', "invalid_sampling"),
        (b'{"id": "ua", "prompt": "a", "adapter": "legl"}', "unknown_adapter"),
        (b'{"id": "biased", "prompt": "a", "adapter": "biased"}', "unsupported_adapter"),
        (b'{"id": "utf", "prompt": "caf\xe9"}', "invalid_utf8"),
        (json.dumps({"id": "long", "prompt": LONG}).encode(), None),  # the engine's own error code
        (b'{"id": "legal-1", "prompt": "again"}', "duplicate_id"),
    ]


def mixed_input(path):
    raw, codes = [], []
    bad = bad_lines()
    for i, good in enumerate(GOOD):
        raw.append(json.dumps(good).encode())
        codes.append("ok")
        for line, code in bad[2 * i : 2 * i + 2]:
            raw.append(line)
            codes.append(code or "engine")
        raw.append(b"   ")  # blank lines get no record
    path.write_bytes(b"\n".join(raw) + b"\n")
    return codes


def test_every_bad_line_gets_one_error_record_and_no_good_line_is_lost(model_dir, broken_adapter, tmp_path):
    inp, out, errors, stats = (tmp_path / n for n in ("in.jsonl", "out.jsonl", "err.jsonl", "stats.json"))
    codes = mixed_input(inp)
    rc, stdout, stderr = run_cli(
        [
            "run",
            str(inp),
            *adapters_args(model_dir),
            "-a",
            f"biased={broken_adapter}",
            "-o",
            str(out),
            "--errors",
            str(errors),
            "--stats",
            str(stats),
            "--gpu-hour-usd",
            "2.5",
        ]
    )
    assert rc == 3, stderr
    assert stdout == b""  # -o given: nothing on stdout
    assert "biased" in stderr and "LoRA bias" in stderr  # the pre-flight warning names the adapter and the feature
    recs = read_jsonl(out)
    assert len(recs) == len(codes)
    for rec, code in zip(recs, codes):
        if code == "ok":
            assert "error" not in rec and isinstance(rec["text"], str), rec
            assert rec["finish_reason"] in ("stop", "length") and rec["usage"]["prompt_tokens"] > 0
        else:
            assert set(rec) == {"id", "adapter", "error"}, rec
            assert rec["error"]["message"].startswith("line "), rec
            if code != "engine":
                assert rec["error"]["code"] == code, rec
    ids = [r["id"] for r in recs]
    assert ids[0] == "base-1" and "long" in ids and ids.count("legal-1") == 2  # the duplicate is recorded too
    physical = inp.read_bytes().split(b"\n").index(json.dumps(GOOD[-1]).encode()) + 1
    assert [r["id"] for r in recs if "error" not in r][-1] == physical  # default id: the physical line number
    long_rec = recs[ids.index("long")]
    assert "96" in long_rec["error"]["message"]  # names the limit it broke
    assert long_rec["error"]["message"].split(": ")[1].startswith("prompt has")  # not "line 9: request long: ..."
    assert read_jsonl(errors) == [r for r in recs if "error" in r]

    ok = {r["id"]: r for r in recs if "error" not in r}
    assert ok["base-1"]["text"] == ok["alias-1"]["text"]  # "base" means the base model
    assert ok["legal-1"]["text"] != ok["base-1"]["text"]  # the adapter is applied
    assert ok["med-1"]["usage"]["completion_tokens"] <= 4  # the line's own max_tokens wins

    s = json.loads(stats.read_text())
    assert s["records"] == len(codes) and s["errors"] == len(codes) - len(GOOD)
    assert s["ok"] == len(GOOD)
    # the slot count and why (engine/slot_budget.py): the CPU default, one per good adapter up to 8
    assert s["slots"]["max_loras"] == s["max_loras"] and s["slots"]["reason"].startswith("CPU default")
    assert s["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in ok.values())
    assert s["per_adapter"]["legal"]["completion_tokens"] == sum(
        r["usage"]["completion_tokens"] for r in ok.values() if r["adapter"] == "legal"
    )
    assert s["per_adapter"]["legal"]["slot_loads"] >= 1 and s["slot_loads"] >= 3
    # lines unreadable before naming an adapter are not base requests
    assert s["per_adapter"]["(unread)"] == {
        "requests": 3,
        "errors": 3,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "slot_loads": 0,
    }
    assert s["per_adapter"]["base"]["requests"] == sum(1 for r in recs if r.get("adapter") in (None, "base")) - 3
    assert s["cost"]["usd_total"] == pytest.approx(2.5 * s["wall_seconds"] / 3600, rel=1e-3)
    assert s["engine"]["model"] and s["device"] == "cpu"


def test_output_is_in_input_order_whatever_the_engine_order(model_dir, tmp_path):
    """Same requests, reversed file: every id keeps its text (the reorder buffer maps results to lines)."""
    rows = [
        {
            "id": f"r{i}",
            "prompt": f"The court held that {i}",
            "adapter": ["legal", "medical", None, "code"][i % 4],
            "max_tokens": 3 + i % 5,
        }
        for i in range(24)
    ]
    a = write_jsonl(tmp_path / "a.jsonl", rows)
    b = write_jsonl(tmp_path / "b.jsonl", rows[::-1])
    rc1, out1, err1 = run_cli(["run", str(a), *adapters_args(model_dir, "--max-loras", "2", "-q")])
    rc2, out2, err2 = run_cli(["run", str(b), *adapters_args(model_dir, "--max-loras", "2", "-q")])
    assert rc1 == rc2 == 0, err1 + err2
    r1, r2 = read_jsonl(out1), read_jsonl(out2)
    assert [r["id"] for r in r1] == [r["id"] for r in rows]
    assert [r["id"] for r in r2] == [r["id"] for r in rows[::-1]]
    assert {r["id"]: r["text"] for r in r1} == {r["id"]: r["text"] for r in r2}
    assert err1 == "" and err2 == ""  # --quiet: nothing on stderr


def test_openai_batch_file(model_dir, tmp_path):
    def line(cid, url="/v1/completions", **body):
        return {"custom_id": cid, "method": "POST", "url": url, "body": body}

    rows = [
        line("c1", model="legal", prompt="The court held that", max_tokens=5),
        line(
            "c2",
            url="/v1/chat/completions",
            model="medical",
            messages=[{"role": "user", "content": "What is the treatment for asthma?"}],
            max_completion_tokens=6,
        ),
        line("c3", model=str(model_dir / "base"), prompt="The court held that", max_tokens=5),
        line("c4", url="/v1/embeddings", model="legal", input="x"),
        {"custom_id": "c5", "method": "POST", "url": "/v1/completions"},
        line("c6", model="base", prompt="The court held that", max_tokens=5),
        line("c7", model="nobody", prompt="x"),
    ]
    inp = write_jsonl(tmp_path / "batch.jsonl", rows)
    rc, stdout, stderr = run_cli(["run", str(inp), *adapters_args(model_dir, "-q")])
    assert rc == 3, stderr
    recs = read_jsonl(stdout)
    assert [r["custom_id"] for r in recs] == [f"c{i}" for i in range(1, 8)]
    by = {r["custom_id"]: r for r in recs}
    for cid in ("c1", "c2", "c3", "c6"):
        r = by[cid]
        assert r["error"] is None and r["id"].startswith("batch_req_")
        assert r["response"]["status_code"] == 200 and r["response"]["request_id"].startswith("req_")
        body = r["response"]["body"]
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert by["c1"]["response"]["body"]["object"] == "text_completion"
    assert by["c1"]["response"]["body"]["usage"]["completion_tokens"] <= 5
    chat = by["c2"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["model"] == "medical"
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["usage"]["completion_tokens"] <= 6
    base_text = by["c6"]["response"]["body"]["choices"][0]["text"]
    assert by["c3"]["response"]["body"]["choices"][0]["text"] == base_text  # the base model by its path
    assert by["c1"]["response"]["body"]["choices"][0]["text"] != base_text
    for cid, code in (("c4", "invalid_url"), ("c5", "missing_body"), ("c7", "unknown_adapter")):
        assert by[cid]["response"] is None and by[cid]["error"]["code"] == code, by[cid]

    # deterministic record ids: a second run writes the same ids
    rc2, stdout2, _ = run_cli(["run", str(inp), *adapters_args(model_dir, "-q")])
    assert [r["id"] for r in read_jsonl(stdout2)] == [r["id"] for r in recs]


def test_sampling_precedence_and_seeds(model_dir, tmp_path):
    rows = [
        {"id": "gen", "prompt": "The court held that"},  # generation_config.json: max_new_tokens 16
        {"id": "line", "prompt": "The court held that", "max_tokens": 2},
        {"id": "s1", "prompt": "The court held that", "temperature": 1.0, "max_tokens": 12},
        {"id": "s2", "prompt": "The court held that", "temperature": 1.0, "max_tokens": 12, "seed": 7},
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)

    def run(*flags):
        rc, out, err = run_cli(["run", str(inp), *adapters_args(model_dir, "-q", *flags)])
        assert rc == 0, err
        return {r["id"]: r for r in read_jsonl(out)}

    a = run()
    assert a["gen"]["usage"]["completion_tokens"] <= 16 and a["line"]["usage"]["completion_tokens"] <= 2
    if a["gen"]["finish_reason"] == "length":
        assert a["gen"]["usage"]["completion_tokens"] == 16
    b = run("--max-tokens", "5")
    assert b["gen"]["usage"]["completion_tokens"] <= 5 and b["line"]["usage"]["completion_tokens"] <= 2
    if b["gen"]["finish_reason"] == "length":
        assert b["gen"]["usage"]["completion_tokens"] == 5
    assert b["s1"]["text"] == a["s1"]["text"]  # a sampled line without a seed is reproducible (own max_tokens)
    other = run("--seed", "12345")
    assert other["s2"]["text"] == a["s2"]["text"]  # the line's own seed wins over --seed
    assert other["s1"]["text"] != a["s1"]["text"]  # --seed reseeds the lines without one


def test_resume_from_stdin_in_the_openai_format(model_dir, tmp_path):
    rows = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": ["legal", "base", "code"][i % 3], "prompt": f"The court held that {i}", "max_tokens": 4},
        }
        for i in range(9)
    ]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    full_out, out = tmp_path / "full.jsonl", tmp_path / "out.jsonl"
    args = ["run", "-", *adapters_args(model_dir, "-q")]
    rc, _, err = run_cli([*args, "-o", str(full_out)], stdin=data)
    assert rc == 0, err
    full = full_out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(full[:4]) + full[4][:20])  # an interrupted run: 4 records and a torn one
    rc, _, err = run_cli([*args, "-o", str(out), "--resume"], stdin=data)
    assert rc == 0, err
    a, b = read_jsonl(full_out), read_jsonl(out)
    for rec in a + b:  # `created` is a timestamp: the only field allowed to differ
        rec["response"]["body"].pop("created")
    assert a == b


def test_a_lone_surrogate_prompt_is_one_error_record_not_a_crash(model_dir, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(
        b'{"id": "a", "prompt": "The court held that", "max_tokens": 3}\n'
        b'{"id": "bad", "prompt": "x \\ud800", "max_tokens": 3}\n'
        b'{"id": "c", "prompt": "The court held that", "max_tokens": 3, "adapter": "legal"}\n'
    )
    rc, stdout, stderr = run_cli(["run", str(inp), *adapters_args(model_dir), "-o", str(out), "-q"])
    assert rc == 3, stderr
    recs = read_jsonl(out)
    assert [r["id"] for r in recs] == ["a", "bad", "c"]
    assert "error" not in recs[0] and "error" not in recs[2]
    assert recs[1]["error"]["code"] == "invalid_request" and "surrogate" in recs[1]["error"]["message"]


def test_preflight_failures_name_the_adapter_once(model_dir, broken_adapter, tmp_path):
    # Records used to read "adapter 'biased' failed pre-flight: adapter 'biased' (/x/adapter_config.json) uses LoRA bias".
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": "d", "prompt": "x", "adapter": "biased"}, {"id": "m", "prompt": "x", "adapter": "medical"}],
    )
    rc, stdout, stderr = run_cli(
        [
            "run",
            str(inp),
            "-m",
            str(model_dir / "base"),
            "--device",
            "cpu",
            "-q",
            "-a",
            f"biased={broken_adapter},medical={model_dir / 'medical'}",
            "--max-lora-rank",
            "1",
        ]
    )
    assert rc == 3, stderr
    d, m = read_jsonl(stdout)
    assert d["error"]["message"].startswith(
        f"line 1: adapter 'biased' failed pre-flight: {broken_adapter / 'adapter_config.json'}: uses LoRA bias"
    ), d
    assert m["error"]["message"].startswith("line 2: adapter 'medical' failed pre-flight: has rank "), m
    for line in stderr.splitlines():
        assert line.count("adapter '") == 1, line  # the warnings too


def test_an_adapter_with_nan_fails_its_own_lines_when_read(model_dir, tmp_path):
    """Pre-flight reads headers only; NaN/Inf is found when the engine reads the adapter: its lines get one
    error record each, naming the tensor, and every other line still completes."""
    import torch
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nanad"
    shutil.copytree(model_dir / "legal", bad)
    f = bad / "adapter_model.safetensors"
    sd = load_file(f)
    key = sorted(k for k in sd if "lora_B" in k)[0]
    sd[key][0, 0] = float("nan")
    save_file(sd, f)
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "n1", "prompt": "x", "adapter": "nanad"},
            {"id": "g", "prompt": "The court held that", "adapter": "medical"},
            {"id": "n2", "prompt": "y", "adapter": "nanad"},
        ],
    )
    rc, stdout, stderr = run_cli(
        [
            "run",
            str(inp),
            "-m",
            str(model_dir / "base"),
            "--device",
            "cpu",
            "-q",
            "--max-model-len",
            "96",
            "-a",
            f"nanad={bad},medical={model_dir / 'medical'}",
        ]
    )
    assert rc == 3, stderr
    n1, g, n2 = read_jsonl(stdout)
    assert "error" not in g and g["text"]
    for rec, line in ((n1, 1), (n2, 3)):
        msg = rec["error"]["message"]
        assert msg.startswith(f"line {line}: ") and "lora_B contains NaN or Inf" in msg, rec
    assert torch.isnan(sd[key]).any()
