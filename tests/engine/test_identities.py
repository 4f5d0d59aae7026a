"""engine/identities.py: adapter identities hashed off the step loop equal adapters/identity.py's."""

from __future__ import annotations

from multilora_cli.adapters.identity import adapter_identity
from multilora_cli.engine.identities import AdapterIdentities, PendingIdentity


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
        assert isinstance(first, PendingIdentity)  # queued on the workers, not hashed on the caller's thread
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


def _gated(gate, started, hashed=None):
    """A hash stand-in that holds the worker which takes "busy" until `gate` is set; `hashed` (a `Hashed`) records
    what was hashed, in order."""

    def hash_fn(path):
        if path.name == "busy":
            started.set()
            gate.wait(30)
        if hashed is not None:
            hashed.add(path.name)
        return f"lora:{path.name}"

    return hash_fn


class Hashed:
    """The names hashed so far, in order; `wait_for(n)` blocks until n were. A test that counts the caller's
    hashes waits for the worker to finish its queue first: resolving a name the worker has not reached yet
    takes it back and hashes it on the caller (by design), so without the wait the count depends on thread timing."""

    def __init__(self):
        import threading

        self.names: list[str] = []
        self._cv = threading.Condition()

    def add(self, name: str) -> None:
        with self._cv:
            self.names.append(name)
            self._cv.notify_all()

    def wait_for(self, n: int) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: len(self.names) >= n, 30)


def test_an_identity_still_queued_is_hashed_at_once_by_the_admission(tmp_path):
    """The admission does not wait behind other adapters' hashes: a queued one is taken back and hashed on the spot."""
    import threading

    gate, started = threading.Event(), threading.Event()
    paths = {n: tmp_path / n for n in ("busy", "a")}
    ids = AdapterIdentities(paths, threads=1, hash_fn=_gated(gate, started))
    try:
        ids.start("busy")
        assert started.wait(30)  # the one worker is busy
        pending = ids.start("a")
        assert isinstance(pending, PendingIdentity) and not pending.done()
        assert pending.get() == "lora:a"  # not blocked by the busy worker
        assert ids.caller_hashes == 1 and ids.queued() == []
        assert ids.start("a") == "lora:a"
    finally:
        gate.set()
        ids.close()


def test_hurry_puts_the_next_admissions_hashes_first(tmp_path):
    """Fed in request order, hashed in the order the scheduler will admit them (issue 38: 1,000 adapters)."""
    import threading

    gate, started, hashed = threading.Event(), threading.Event(), Hashed()
    names = ["busy", "a", "b", "c", "d"]
    ids = AdapterIdentities({n: tmp_path / n for n in names}, threads=1, hash_fn=_gated(gate, started, hashed))
    try:
        got = {n: ids.start(n) for n in names}
        assert started.wait(30)
        assert ids.queued() == ["a", "b", "c", "d"]
        PendingIdentity.hurry([got["d"], got["b"]])
        assert ids.queued() == ["d", "b", "a", "c"]
        gate.set()
        assert hashed.wait_for(len(names))  # the worker's whole queue (see `Hashed`)
        assert hashed.names == ["busy", "d", "b", "a", "c"]  # in the hurried order
        assert [ids.resolve(got[n]) for n in names] == [f"lora:{n}" for n in names]
        assert ids.caller_hashes == 0
    finally:
        gate.set()
        ids.close()


def test_closed_identities_still_resolve_on_the_caller(tmp_path):
    a = _folder(tmp_path / "a", b"q" * 100)
    ids = AdapterIdentities({"a": a, "b": _folder(tmp_path / "b", b"r" * 100)}, threads=1)
    ids.close()
    pending = ids.start("a")
    assert ids.resolve(pending) == f"lora:{adapter_identity(a)}"


def test_start_all_queues_every_hash_in_order_and_admissions_find_them(tmp_path):
    """The engine queues every adapter's hash at its start (issue 38): in the order given, once each, none on the
    caller's thread; a later `start` gets the same identity."""
    import threading

    gate, started, hashed = threading.Event(), threading.Event(), Hashed()
    names = ["busy", "a", "b", "c"]
    ids = AdapterIdentities({n: tmp_path / n for n in names}, threads=1, hash_fn=_gated(gate, started, hashed))
    try:
        ids.start_all(names)
        assert started.wait(30)
        assert ids.queued() == ["a", "b", "c"]
        ids.start_all(["c", "a"])  # known already: not queued twice
        assert ids.queued() == ["a", "b", "c"]
        gate.set()
        assert hashed.wait_for(len(names)) and hashed.names == names  # the worker's whole queue, once each
        assert [ids.resolve(ids.start(n)) for n in names] == [f"lora:{n}" for n in names]
        assert ids.caller_hashes == 0
    finally:
        gate.set()
        ids.close()


def test_start_all_without_threads_hashes_nothing(tmp_path):
    calls = []
    ids = AdapterIdentities({"a": tmp_path / "a"}, threads=0, hash_fn=lambda p: calls.append(p) or "lora:a")
    ids.start_all(["a"])
    assert calls == []
    assert ids.start("a") == "lora:a" and len(calls) == 1
    ids.close()
