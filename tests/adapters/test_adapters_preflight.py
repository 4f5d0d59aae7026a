"""parse_adapter_specs and preflight: names, --adapter-dir, base agreement, collected errors, pool sizing."""

from __future__ import annotations

import json
import shutil

import pytest

from multilora_cli.adapters.base_match import model_key
from multilora_cli.adapters.preflight import DEFAULT_MAX_LORAS, parse_adapter_specs, preflight
from multilora_cli.errors import AdapterError, ResolveError, UnsupportedAdapterError, UsageError


@pytest.fixture(scope="module")
def fleet(zoo, llama_base, qwen2_base, good_adapter, tmp_path_factory):
    """legal (r8), medical (r16, rank_pattern up to 32) on llama; chat on qwen2; an --adapter-dir of copies."""
    root = tmp_path_factory.mktemp("fleet")
    medical = zoo.adapter(
        "medical", llama_base, r=16, alpha=16, targets=["q_proj", "k_proj", "down_proj"], rank_pattern={"down_proj": 32}
    )
    chat = zoo.adapter("chat", qwen2_base, r=4, alpha=8)
    dora = zoo.adapter("dora", llama_base, use_dora=True)
    biased = zoo.adapter("biased", llama_base, lora_bias=True)
    lib = root / "lib"
    for name, src in (("legal", good_adapter), ("medical", medical)):
        shutil.copytree(src, lib / name)
    (lib / "not-an-adapter").mkdir()
    shutil.copytree(good_adapter, lib / ".old-legal")  # hidden (a backup, a trash folder): not an adapter to run
    (lib / "README.txt").write_text("x")
    return dict(legal=good_adapter, medical=medical, chat=chat, dora=dora, biased=biased, lib=lib, root=root)


def test_parse_specs_names(fleet, tmp_path, monkeypatch):
    monkeypatch.chdir(fleet["lib"])
    got = parse_adapter_specs(["legal,medical", "x=./legal", " org/chat-lora@v2 ", "org/other"], None)
    assert got == {
        "legal": "legal",
        "medical": "medical",
        "x": "./legal",
        "org/chat-lora": "org/chat-lora@v2",
        "org/other": "org/other",
    }
    assert parse_adapter_specs(["legal", "./legal/"], None) == {"legal": "legal"}  # same folder twice: one entry
    assert list(parse_adapter_specs([], str(fleet["lib"]))) == ["legal", "medical"]
    both = parse_adapter_specs([f"law={fleet['legal']}"], str(fleet["lib"]))
    assert list(both) == ["law", "legal", "medical"] and both["law"] == str(fleet["legal"])


@pytest.mark.parametrize(
    "items, adapter_dir, message",
    [
        (["base=./x"], None, "adapter name 'base' is reserved"),
        (["./base"], None, "adapter name 'base' is reserved"),
        (["a=./x", "a=./y"], None, "adapter name 'a' is given twice"),
        (["=./x"], None, "expected NAME=PATH"),
        (["a="], None, "expected NAME=PATH"),
        ([], "/no/such/dir", "is not a directory"),
    ],
)
def test_parse_specs_usage_errors(items, adapter_dir, message):
    with pytest.raises(UsageError) as e:
        parse_adapter_specs(items, adapter_dir)
    assert message in e.value.message and e.value.exit_code == 2


def test_adapter_dir_without_adapters(fleet):
    with pytest.raises(UsageError, match="has no subfolder holding adapter_config.json") as e:
        parse_adapter_specs([], str(fleet["legal"]))
    assert "use --adapters" in e.value.hint  # it is an adapter itself


def test_duplicate_name_across_flags(fleet):
    with pytest.raises(UsageError, match="'legal' is given twice"):
        parse_adapter_specs([f"legal={fleet['medical']}"], str(fleet["lib"]))


def test_preflight_base_from_adapters(fleet, llama_base):
    specs = parse_adapter_specs([], str(fleet["lib"]))
    pf = preflight(specs, None)
    assert pf.errors == {}
    assert pf.model_path == llama_base.resolve() and pf.model == str(llama_base.resolve())
    assert pf.model_config.hidden_size == 64
    assert pf.ranks == {"legal": 8, "medical": 32} and pf.max_lora_rank == 32
    assert pf.max_loras == 2 and set(pf.adapters) == {"legal", "medical"}
    # the scans the engine plans its reads from (Engine(scans=...)): one per adapter that passed, of its folder
    assert set(pf.scans) == {"legal", "medical"} and pf.scans["medical"].max_rank == 32
    assert all(pf.scans[n].path == pf.adapters[n] and pf.scans[n].ident is not None for n in pf.scans)
    sized = preflight(specs, str(llama_base), max_loras=5, max_lora_rank=64)
    assert (sized.max_loras, sized.max_lora_rank) == (5, 64)


def test_preflight_disagreeing_bases(fleet, llama_base):
    specs = {"legal": str(fleet["legal"]), "chat": str(fleet["chat"])}
    with pytest.raises(UsageError) as e:
        preflight(specs, None)
    assert "different base models" in e.value.message and "legal ->" in e.value.message
    assert "--model" in e.value.hint
    pf = preflight(specs, str(llama_base))  # --model settles it (tiny qwen2 and llama share shapes)
    assert set(pf.ranks) == {"legal", "chat"}


def test_preflight_collects_every_error(fleet, llama_base, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(fleet["legal"], broken)
    (broken / "adapter_config.json").unlink()
    specs = {
        "legal": str(fleet["legal"]),
        "gone": "./no/such/dir",
        "broken": str(broken),
        "dora": str(fleet["dora"]),
        "biased": str(fleet["biased"]),
        "medical": str(fleet["medical"]),
    }
    pf = preflight(specs, str(llama_base), max_lora_rank=16)
    assert set(pf.adapters) == {"legal", "dora"} and pf.ranks == {"legal": 8, "dora": 8} and pf.max_lora_rank == 16
    assert set(pf.scans) == {"legal", "dora"}  # none for adapters that failed; DoRA is served
    assert isinstance(pf.errors["gone"], ResolveError)
    assert pf.errors["gone"].message.startswith("adapter 'gone' (./no/such/dir): path")
    assert isinstance(pf.errors["broken"], AdapterError) and "no adapter_config.json" in pf.errors["broken"].message
    assert isinstance(pf.errors["biased"], UnsupportedAdapterError) and "LoRA bias" in pf.errors["biased"].message
    assert "rank 32, above --max-lora-rank 16" in pf.errors["medical"].message
    assert "raise --max-lora-rank to 32" in pf.errors["medical"].hint


def test_preflight_relative_base_and_no_base(fleet, llama_base, tmp_path):
    shutil.copytree(llama_base, tmp_path / "models" / "tiny")
    ad = tmp_path / "adapters" / "rel"
    shutil.copytree(fleet["legal"], ad)
    cfg = json.loads((ad / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "../../models/tiny"  # relative to the adapter folder
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    pf = preflight({"rel": str(ad)}, None)
    assert pf.model_path == (tmp_path / "models" / "tiny").resolve() and pf.ranks == {"rel": 8}
    cfg["base_model_name_or_path"] = None
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="names no base_model_name_or_path"):
        preflight({"rel": str(ad)}, None)
    with pytest.raises(UsageError, match="no --model and no adapters"):
        preflight({}, None)
    with pytest.raises(ResolveError):  # every adapter unresolvable and no --model: the adapter's own error
        preflight({"gone": "./no/such/dir"}, None)


def test_preflight_defaults_and_flag_checks(fleet, llama_base):
    many = {f"a{i}": str(fleet["legal"]) for i in range(DEFAULT_MAX_LORAS + 3)}
    assert preflight(many, str(llama_base)).max_loras == DEFAULT_MAX_LORAS
    assert preflight({}, str(llama_base)).max_loras == 1 and preflight({}, str(llama_base)).max_lora_rank == 1
    with pytest.raises(UsageError, match="--max-loras must be at least 1"):
        preflight({}, str(llama_base), max_loras=0)
    with pytest.raises(UsageError, match="--max-lora-rank must be at least 1"):
        preflight({}, str(llama_base), max_lora_rank=0)


def test_missing_base_from_the_adapters_says_where_it_came_from(fleet, tmp_path):
    # A copied / moved adapter keeps the absolute base path it was trained with; the error used to read like a
    # path the user typed ("check the path, or pass a Hub id") without saying it came from adapter_config.json.
    ad = tmp_path / "moved" / "legal"
    shutil.copytree(fleet["legal"], ad)
    cfg = json.loads((ad / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "gone" / "base")
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ResolveError) as e:
        preflight({"legal": str(ad)}, None)
    msg = e.value.one_line()
    assert "does not exist" in msg and "base_model_name_or_path of adapter(s) legal" in msg, msg
    assert "pass --model" in msg
    with pytest.raises(ResolveError) as e:  # a --model the user typed keeps the plain message
        preflight({"legal": str(ad)}, str(tmp_path / "gone" / "base"))
    assert "base_model_name_or_path" not in e.value.one_line()


def test_model_key_forms():
    assert model_key("meta-llama/Meta-Llama-3-8B@main") == "meta-llama-3-8b"
    assert model_key("/models/Meta-Llama-3-8B/") == "meta-llama-3-8b"
    cache = "/h/.cache/huggingface/hub/models--meta-llama--Meta-Llama-3-8B/snapshots/0a1b"
    assert model_key(cache) == "meta-llama-3-8b"
    assert model_key("C:\\models\\Llama") == "llama" and model_key("") == ""


def test_preflight_warns_when_model_is_not_the_named_base(fleet, llama_base, tmp_path):
    # shapes fit, so the adapter runs; but an adapter on another base than it names is quietly worse: say so
    specs = {"legal": str(fleet["legal"]), "chat": str(fleet["chat"])}
    pf = preflight(specs, str(llama_base))
    assert len(pf.warnings) == 1, pf.warnings
    assert pf.warnings[0].startswith("adapter 'chat' names base model") and "base-qwen2" in pf.warnings[0]
    assert f"not the --model {str(llama_base)!r}" in pf.warnings[0]
    assert preflight({"legal": str(fleet["legal"])}, None).warnings == []  # no --model: the named base runs
    copy = tmp_path / "copy" / llama_base.name  # the same model elsewhere, under its name
    shutil.copytree(llama_base, copy)
    assert preflight({"legal": str(fleet["legal"])}, str(copy)).warnings == []
    other = tmp_path / "tiny"
    shutil.copytree(llama_base, other)
    many = {f"a{i}": str(fleet["legal"]) for i in range(5)}
    (w,) = preflight(many, str(other)).warnings  # one line per named base, adapters listed up to 3
    assert w.startswith("adapters 'a0', 'a1', 'a2' and 2 more name base model") and str(llama_base) in w


def test_preflight_run_prints_the_base_warning(fleet, llama_base, capsys):
    from multilora_cli.run.config import RunConfig
    from multilora_cli.run.setup import preflight_run

    preflight_run(RunConfig(input="-", model=str(llama_base), adapters=[f"chat={fleet['chat']}"]))
    err = capsys.readouterr().err
    assert err.startswith("multilora: warning: adapter 'chat' names base model") and err.count("\n") == 1


def test_unknown_user_home_is_a_missing_path_not_a_crash(fleet, llama_base, tmp_path):
    # Path("~nosuchuser/x").expanduser() raises RuntimeError: it was an internal error in every flag taking a path
    assert parse_adapter_specs(["~nosuchuser-ml/x"], None) == {"x": "~nosuchuser-ml/x"}
    pf = preflight({"x": "~nosuchuser-ml/x"}, str(llama_base))
    assert isinstance(pf.errors["x"], ResolveError) and "does not exist" in pf.errors["x"].message
    with pytest.raises(UsageError, match="is not a directory"):
        parse_adapter_specs([], "~nosuchuser-ml")
    ad = tmp_path / "ad"
    shutil.copytree(fleet["legal"], ad)
    cfg = json.loads((ad / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "~nosuchuser-ml/base"
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ResolveError, match="does not exist"):
        preflight({"ad": str(ad)}, None)
    assert preflight({"ad": str(ad)}, str(llama_base)).warnings  # named base differs from --model: a warning
