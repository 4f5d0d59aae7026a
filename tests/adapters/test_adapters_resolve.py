"""resolve(): local paths in vLLM's order, and Hub ids through a pre-populated HF cache (never the network).

Hub error mapping (unknown / gated repo, missing revision) runs the real huggingface_hub client against a
local HTTP server that answers like the Hub does (status + X-Error-Code), pointed to by HF_ENDPOINT.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.adapters.resolve import resolve
from multilora_cli.errors import ResolveError

SHA = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "fedcba9876543210fedcba9876543210fedcba98"


def make_cache(cache: Path, repo: str, src: Path, sha: str = SHA, ref: str = "main") -> Path:
    """Lay out `src`'s files as the HF cache does: models--org--name/{refs/<ref>, snapshots/<sha>/...}."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(sha)
    snap = folder / "snapshots" / sha
    snap.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, snap / f.name)
    return snap


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HF_HOME", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)


def test_absolute_relative_and_home_paths(good_adapter, tmp_path, monkeypatch):
    assert resolve(str(good_adapter)) == good_adapter.resolve()
    home = tmp_path / "home"
    shutil.copytree(good_adapter, home / "loras" / "legal")
    monkeypatch.setenv("HOME", str(home))
    assert resolve("~/loras/legal") == (home / "loras" / "legal").resolve()
    monkeypatch.chdir(home)
    assert resolve("loras/legal") == (home / "loras" / "legal").resolve()
    assert resolve("./loras/legal/") == (home / "loras" / "legal").resolve()
    # A file of the adapter stands for its folder; any other file is refused.
    assert resolve("loras/legal/adapter_config.json") == (home / "loras" / "legal").resolve()
    (home / "notes.txt").write_text("x")
    with pytest.raises(ResolveError, match="is a file; expected a directory"):
        resolve("notes.txt")


# "~nosuchuser-ml/x": Path.expanduser raised RuntimeError for a user that does not exist (an internal error)
@pytest.mark.parametrize(
    "spec", ["./nope", "../nope", "/definitely/not/here", "~/nope", "a/b/c", "loras/nope", "~nosuchuser-ml/x"]
)
def test_missing_local_paths(spec, tmp_path, monkeypatch, offline):
    (tmp_path / "loras").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ResolveError) as e:
        resolve(spec)
    assert f"adapter {spec!r}: path" in e.value.message and "does not exist" in e.value.message
    assert "Hub id" in e.value.hint


def test_not_a_path_nor_an_id(offline):
    with pytest.raises(ResolveError, match="neither an existing path nor a valid Hugging Face Hub id"):
        resolve("no such thing!")


def test_hub_id_from_cache_dir(good_adapter, tmp_path, offline):
    snap = make_cache(tmp_path / "cache", "org/legal", good_adapter)
    got = resolve("org/legal", cache_dir=str(tmp_path / "cache"), local_files_only=True)
    assert got == snap
    adapter = load_adapter(got, "org/legal")
    assert adapter.max_rank == 8


def test_hub_env_cache_and_revisions(good_adapter, llama_base, tmp_path, monkeypatch, offline):
    cache = tmp_path / "hf" / "hub"
    snap = make_cache(cache, "org/legal", good_adapter)
    snap2 = make_cache(cache, "org/legal", good_adapter, sha=SHA2, ref="v2")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # HF_HOME/hub is the default cache
    assert resolve("org/legal") == snap
    assert resolve("org/legal@v2") == snap2
    assert resolve(f"org/legal@{SHA2}") == snap2
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))  # HF_HUB_CACHE wins over HF_HOME
    with pytest.raises(ResolveError):
        resolve("org/legal")
    base_snap = make_cache(tmp_path / "elsewhere", "org/base", llama_base)
    assert resolve("org/base", kind="model") == base_snap


def test_offline_and_not_cached(tmp_path, offline):
    with pytest.raises(ResolveError) as e:
        resolve("org/missing", cache_dir=str(tmp_path))
    assert "adapter 'org/missing' is not in" in e.value.message and "HF_HUB_OFFLINE" in e.value.message
    assert "hf download org/missing" in e.value.hint
    with pytest.raises(ResolveError, match="model 'org/base@v9' is not in") as e:
        resolve("org/base@v9", kind="model", cache_dir=str(tmp_path))
    assert "hf download org/base --revision v9" in e.value.hint  # the revision asked for, not main


def test_bare_word_not_found_says_no_such_folder_first(tmp_path, monkeypatch, offline):
    # `-a legl` (a typo of ./legal) used to read as a Hub failure only; the likelier cause comes first now.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "legal").mkdir()
    with pytest.raises(ResolveError) as e:
        resolve("legl", cache_dir=str(tmp_path / "cache"), name="legal")
    msg = e.value.one_line()
    assert msg.startswith("adapter 'legal' (legl): there is no folder 'legl' in " + str(tmp_path)), msg
    assert "Hub id, it is not in" in msg and "HF_HUB_OFFLINE" in msg and "check the folder name" in msg
    assert msg.count("adapter 'legal'") == 1, msg
    with pytest.raises(ResolveError) as e:  # org/name reads as a Hub id first, but may be a mistyped folder too
        resolve("org/missing", cache_dir=str(tmp_path / "cache"))
    msg = e.value.one_line()
    assert msg.startswith("adapter 'org/missing' is not in"), msg
    assert f"there is no local folder 'org/missing' in {tmp_path} either" in msg


def test_inspect_hub_id_offline(cli, good_adapter, llama_base, tmp_path, monkeypatch, offline):
    make_cache(tmp_path / "cache", "org/legal", good_adapter)
    make_cache(tmp_path / "cache", "org/base", llama_base)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    rc, out, err = cli("inspect", "org/legal", "--model", "org/base")
    assert rc == 0, err
    assert "servable by multilora: yes" in out and "shapes checked against org/base" in out


def test_hub_unknown_gated_and_bad_revision(fake_hub):
    with pytest.raises(ResolveError) as e:
        resolve("org/unknown")
    assert "repo 'org/unknown' does not exist or is private" in e.value.message and "HF_TOKEN" in e.value.hint
    with pytest.raises(ResolveError) as e:
        resolve("org/gated", kind="model")
    assert "model 'org/gated'" in e.value.message and "is gated" in e.value.message
    assert "https://huggingface.co/org/gated" in e.value.hint
    with pytest.raises(ResolveError) as e:
        resolve("org/legal@nobranch")
    assert "revision 'nobranch' does not exist" in e.value.message


def test_inspect_unknown_repo_exit_code(cli, fake_hub):
    rc, out, err = cli("inspect", "org/unknown")
    assert rc == 1 and out == ""
    assert err.startswith("error: adapter 'org/unknown': Hugging Face Hub repo 'org/unknown' does not exist")
    assert len(err.strip().splitlines()) == 1
