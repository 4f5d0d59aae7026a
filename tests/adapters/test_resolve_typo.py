"""`-a some/typo` (no ./, no such folder) reads as a Hub id first, but is as likely a mistyped folder: the error
says both, on one line. A repo the Hub has (gated, or a missing revision) was meant as a Hub id: no folder talk."""

from __future__ import annotations

import pytest

from multilora_cli.adapters.resolve import resolve
from multilora_cli.errors import ResolveError


def test_offline_typo_says_no_such_local_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResolveError) as e:
        resolve("loras/legl", cache_dir=str(tmp_path / "cache"))
    msg = e.value.one_line()
    assert msg.startswith("adapter 'loras/legl' is not in"), msg
    assert f"; there is no local folder 'loras/legl' in {tmp_path} either" in msg
    assert msg.endswith("for a local folder, check its name and the current directory)"), msg


def test_unknown_repo_says_no_such_local_folder(fake_hub, tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResolveError) as e:
        resolve("some/typo", kind="model")
    assert e.value.message == (
        "model 'some/typo': Hugging Face Hub repo 'some/typo' does not exist or is private; "
        f"there is no local folder 'some/typo' in {tmp_path} either"
    )
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    rc, out, err = cli("run", inp, "-a", "some/typo", "--device", "cpu")
    assert rc == 1 and "no local folder 'some/typo'" in err and "does not exist or is private" in err


def test_repo_the_hub_has_gets_no_folder_talk(fake_hub):
    for spec in ("org/gated", "org/legal@nobranch"):
        with pytest.raises(ResolveError) as e:
            resolve(spec)
        assert "local folder" not in e.value.one_line(), spec
