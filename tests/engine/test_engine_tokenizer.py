"""Tokenizer vs transformers' AutoTokenizer on real tokenizer directories; chat templates; eos ids;
generation_config defaults."""

from __future__ import annotations

import json

import pytest

from multilora_cli.engine.generation_config import read_generation_config
from multilora_cli.engine.request import Request
from multilora_cli.engine.tokenizer import Tokenizer
from multilora_cli.errors import ModelError, RequestError
from tests.engine.engine_tok import TEXT, write_chatml_dir, write_llama3_dir

SAMPLES = TEXT + ["  two leading spaces", "tab\tand\nnewline", "<|im_start|>literal<|eot_id|> specials", "x"]
CHATS = [
    [{"role": "user", "content": "héllo wörld 🌍"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "What is LoRA?"},
        {"role": "assistant", "content": "A low-rank adapter."},
        {"role": "user", "content": "東京 and ### END"},
    ],
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {
        "llama3": write_llama3_dir(root / "llama3"),
        "llama3_jinja": write_llama3_dir(root / "llama3_jinja", template_in_jinja=True),
        # transformers 5 ignores add_bos_token when tokenizer.json exists; so must we
        "llama3_nobos": write_llama3_dir(root / "llama3_nobos", add_bos_token=False),
        "chatml": write_chatml_dir(root / "chatml"),
        "metaspace": write_chatml_dir(root / "metaspace", metaspace=True),
        "plain": write_chatml_dir(root / "plain", with_template=False),
    }


def hf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def hf_chat_ids(tok, messages):
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


@pytest.mark.parametrize("name", ["llama3", "llama3_nobos", "chatml", "metaspace"])
def test_encode_decode_match_transformers(dirs, name):
    ours, ref = Tokenizer.from_dir(dirs[name]), hf(dirs[name])
    for text in SAMPLES:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", ["llama3", "llama3_jinja", "chatml", "metaspace"])
def test_chat_template_matches_transformers(dirs, name):
    ours, ref = Tokenizer.from_dir(dirs[name]), hf(dirs[name])
    for messages in CHATS:
        assert ours.render_chat(messages) == ref.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert ours.apply_chat_template(messages) == hf_chat_ids(ref, messages)


def test_template_bos_is_not_doubled(dirs):
    tok = Tokenizer.from_dir(dirs["llama3"])
    ids = tok.apply_chat_template(CHATS[0])
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.encode("hi")[0] == tok.bos_token_id  # plain prompts do get the post-processor's BOS


def test_chat_template_file_wins_over_config(dirs):
    tok = Tokenizer.from_dir(dirs["llama3_jinja"])
    assert "IGNORED" not in tok.chat_template and "start_header_id" in tok.chat_template


def test_eos_is_the_union_of_config_generation_config_and_tokenizer(dirs):
    tok = Tokenizer.from_dir(dirs["llama3"])
    b = tok.backend
    assert set(tok.eos_token_ids) == {
        b.token_to_id("<|end_of_text|>"),
        b.token_to_id("<|eom_id|>"),
        b.token_to_id("<|eot_id|>"),
    }
    chatml = Tokenizer.from_dir(dirs["chatml"])
    assert set(chatml.eos_token_ids) == {
        chatml.backend.token_to_id("<|endoftext|>"),
        chatml.backend.token_to_id("<|im_end|>"),
    }
    assert chatml.bos_token_id is None


def test_template_helpers_and_errors(dirs):
    tok = Tokenizer.from_dir(dirs["chatml"])
    listed = [{"role": "user", "content": [{"type": "text", "text": "é<b>"}]}]
    assert '"é<b>"' in tok.render_chat(listed)  # tojson without HTML escaping or ASCII escapes
    with pytest.raises(RequestError, match="roles must be"):
        tok.render_chat([{"role": "bad", "content": "x"}])
    with pytest.raises(RequestError):
        tok.render_chat([{"content": "no role"}])
    plain = Tokenizer.from_dir(dirs["plain"])
    with pytest.raises(RequestError, match="no chat template") as e:
        plain.apply_chat_template(CHATS[0])
    assert e.value.code == "no_chat_template"


def test_encode_request(dirs):
    tok = Tokenizer.from_dir(dirs["llama3"])
    assert tok.encode_request(Request(key=0, id="a", prompt="hello")) == tok.encode("hello")
    assert tok.encode_request(Request(key=1, id="b", messages=CHATS[0])) == tok.apply_chat_template(CHATS[0])
    assert tok.encode_request(Request(key=2, id="c", prompt_token_ids=[5, 6])) == [5, 6]
    with pytest.raises(RequestError):
        tok.encode_request(Request(key=3, id="d", prompt_token_ids=[tok.vocab_size]))
    chatml = Tokenizer.from_dir(dirs["chatml"])  # no BOS: an empty prompt is empty
    with pytest.raises(RequestError, match="empty"):
        chatml.encode_request(Request(key=4, id="e", prompt=""))


def test_bad_directories(tmp_path):
    with pytest.raises(ModelError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    d = write_chatml_dir(tmp_path / "broken")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(d)  # loads: the template compiles at the first chat line (plain prompts never need it)
    assert tok.encode_request(Request(key=0, id="p", prompt="hi")) == tok.encode("hi")
    with pytest.raises(ModelError, match="does not compile"):
        tok.encode_request(Request(key=1, id="c", messages=[{"role": "user", "content": "hi"}]))


def test_generation_config_defaults(tmp_path):
    def gc(data):
        (tmp_path / "generation_config.json").write_text(json.dumps(data))
        return read_generation_config(tmp_path)

    assert read_generation_config(tmp_path / "missing").sampling == {}
    g = gc({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 64, "eos_token_id": [1, 2]})
    assert g.sampling == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 64} and g.eos_token_ids == [1, 2]
    assert gc({"temperature": 0.7, "top_k": 20, "eos_token_id": 3}).sampling == {"temperature": 0.0}
    assert gc({"do_sample": False, "temperature": 0.7}).sampling == {"temperature": 0.0}
    assert gc({"do_sample": True, "top_k": 20}).sampling == {"temperature": 1.0, "top_k": 20}
    assert gc({"bos_token_id": 1}).sampling == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ModelError):
        read_generation_config(tmp_path)
