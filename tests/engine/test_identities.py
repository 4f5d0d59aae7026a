"""engine/identities.py: adapter identities hashed off the step loop equal adapters/identity.py's."""

from __future__ import annotations

from concurrent.futures import Future

from multilora_cli.adapters.identity import adapter_identity
from multilora_cli.engine.identities import AdapterIdentities


def _folder(path, payload: bytes):
    path.mkdir()
    (path / "adapter_config.json").write_text('{"r": 4}')
    (path / "adapter_model.safetensors").write_bytes(payload)
    return path


def test_background_identity_equals_the_ledger_hash_and_is_hashed_once(tmp_path):
    a = _folder(tmp_path / "a", b"x" * 5000)
    twin = _folder(tmp_path / "twin", b"x" * 5000)
    other = _folder(tmp_path / "other", b"y" * 5000)
    ids = AdapterIdentities({"a": a, "twin": twin, "other": other})
    try:
        first = ids.start("a")
        assert isinstance(first, Future)  # started on the worker, not hashed on the caller's thread
        got = {n: ids.resolve(ids.start(n)) for n in ("a", "twin", "other")}
        assert got["a"] == f"lora:{adapter_identity(a)}" == got["twin"] != got["other"]
        assert ids.start("a") == got["a"]  # a finished hash is kept as the string
    finally:
        ids.close()


def test_without_threads_the_identity_is_hashed_inline(tmp_path):
    a = _folder(tmp_path / "a", b"z" * 100)
    ids = AdapterIdentities({"a": a}, threads=0)
    assert ids.start("a") == f"lora:{adapter_identity(a)}"
    ids.close()
