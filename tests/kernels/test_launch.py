"""kernels/launch.py: launches recorded inside collect() and not run, variants deduplicated, compiled in parallel."""

from __future__ import annotations

import threading

import pytest
import torch

from multilora_cli.kernels import launch as L


class FakeKernel:
    """Stands in for a JITFunction: `kernel[grid](...)` runs, `warmup(...)` compiles (both recorded)."""

    def __init__(self):
        self.runs, self.warmups, self.threads = [], [], set()
        self._lock = threading.Lock()

    def __getitem__(self, grid):
        return lambda *a, **k: self.runs.append((grid, a, k))

    def warmup(self, *args, grid, **kwargs):
        with self._lock:
            self.warmups.append((args, kwargs))
            self.threads.add(threading.get_ident())


def test_launch_runs_outside_collect_and_only_records_inside():
    k = FakeKernel()
    x = torch.zeros(4)
    L.launch(k, (2,), x, 3, BLOCK=16)
    assert k.runs == [((2,), (x, 3), {"BLOCK": 16})]
    with L.collect() as calls:
        L.launch(k, (5,), x, 3, BLOCK=16)
    assert len(k.runs) == 1, "a launch inside collect() must not run"
    ((kern, args, kwargs),) = calls
    assert kern is k and args[1] == 3 and kwargs == {"BLOCK": 16}
    assert args[0].dtype == x.dtype and args[0].numel() == 1, "tensors are recorded as stand-ins"
    L.launch(k, (1,), x, 3, BLOCK=16)
    assert len(k.runs) == 2, "collect() ends with its block"


def test_recorded_launches_keep_no_tensor_alive_and_compile_alike():
    """A dry run's activations must be freed as it goes (holding them: ~94 GiB for Llama-3-8B's dry prefills, an
    out-of-memory error at engine start): tensors are recorded as stand-ins with the same variant key."""
    import gc
    import weakref

    k = FakeKernel()
    big = torch.zeros(1 << 20, dtype=torch.bfloat16)
    odd = torch.zeros(64, dtype=torch.float16)[3:]  # an address 6 bytes past a 16-byte boundary
    keys = [L._variant((k, (big, odd, 7), {"out": big}))]
    ref = weakref.ref(big)
    with L.collect() as calls:
        L.launch(k, (1,), big, odd, 7, out=big)
    del big
    gc.collect()
    assert ref() is None, "the recorded launch kept its tensor argument alive"
    (call,) = calls
    assert L._variant(call) == keys[0], "stand-ins must compile the variant the real launch would"
    assert call[1][1].data_ptr() % 16 == odd.data_ptr() % 16 == 6
    assert L.stand_in(torch.ones(8, dtype=torch.bfloat16)) is call[1][0], "one stand-in per (dtype, alignment)"


def test_collect_is_not_nestable_and_resets_after_an_error():
    with pytest.raises(RuntimeError, match="already active"):
        with L.collect():
            with L.collect():
                pass
    with pytest.raises(ValueError):
        with L.collect():
            raise ValueError("boom")
    k = FakeKernel()
    L.launch(k, (1,), 1)
    assert k.runs, "a failed collect() must not leave launches recorded"


def test_compile_all_compiles_each_variant_once(tmp_path):
    k1, k2 = FakeKernel(), FakeKernel()
    a = torch.zeros(64, dtype=torch.float16)
    b = torch.zeros(64, dtype=torch.float16)  # same dtype and alignment: the same variant as a
    c = torch.zeros(64, dtype=torch.float32)
    calls = [
        (k1, (a, 4096), {"BM": 16}),
        (k1, (b, 8192), {"BM": 16}),  # ints specialised alike (% 16): one variant
        (k1, (c, 4096), {"BM": 16}),  # another dtype
        (k1, (a, 1), {"BM": 16}),  # an int equal to 1 specialises apart
        (k1, (a, 4096), {"BM": 32}),  # another constexpr
        (k2, (a, 4096), {"BM": 16}),  # another kernel
    ]
    assert L.compile_all(calls, threads=4, cache_dir=str(tmp_path)) == 5
    assert len(k1.warmups) == 4 and len(k2.warmups) == 1
    assert L.compile_all([], cache_dir=str(tmp_path)) == 0


def test_compile_all_uses_threads_and_reraises(tmp_path):
    k = FakeKernel()
    calls = [(k, (torch.zeros(4), i * 16 + 3), {"V": i}) for i in range(8)]
    assert L.compile_all(calls, threads=4, cache_dir=str(tmp_path)) == 8
    assert len(k.warmups) == 8

    class Broken(FakeKernel):
        def warmup(self, *args, grid, **kwargs):
            raise RuntimeError("compile failed")

    with pytest.raises(RuntimeError, match="compile failed"):
        L.compile_all([(Broken(), (1,), {})], cache_dir=str(tmp_path / "broken"))


def test_variant_keys_follow_the_kernels_parameter_kinds():
    """A do_not_specialize int never splits variants, a constexpr always does (even passed positionally), other
    ints split by Triton's classes. The kernel exposes `params` as a JITFunction does (under the interpreter,
    kernels have none; test_launch_gpu.py checks real ones)."""
    from types import SimpleNamespace as P

    kern = FakeKernel()
    kern.params = [
        P(name="x_ptr", is_constexpr=False, do_not_specialize=False),
        P(name="n", is_constexpr=False, do_not_specialize=True),
        P(name="m", is_constexpr=False, do_not_specialize=False),
        P(name="B", is_constexpr=True, do_not_specialize=False),
    ]
    x = torch.zeros(64)

    def key(*args, **kw):
        return L._variant((kern, args, kw))

    assert key(x, 5, 32, 16) == key(x, 7, 64, 16)  # n ignored; m 32 and 64 both % 16
    assert key(x, 5, 32, 16) != key(x, 5, 33, 16)  # m's class changes
    assert key(x, 5, 32, 16) != key(x, 5, 32, 32)  # constexpr B by value
    assert key(x, 5, 32, B=16) != key(x, 5, 32, B=32)
    assert key(x, 5, 32, 16, num_warps=4) != key(x, 5, 32, 16, num_warps=8)
    assert key(x, 5, 1 << 40, 16) != key(x, 5, 64, 16)  # 64-bit vs 32-bit


def test_variant_keys_skip_alignment_where_the_kernel_does():
    """A pointer (or int) under do_not_specialize_on_alignment is keyed by its dtype (class) alone: views at any
    offset are one variant, as Triton compiles them. Interpreted kernels (TRITON_INTERPRET=1) give the same
    parameter kinds, read off their signature and jit arguments."""
    from types import SimpleNamespace as P

    kern = FakeKernel()
    kern.params = [
        P(name="x_ptr", is_constexpr=False, do_not_specialize=False, do_not_specialize_on_alignment=True),
        P(name="y_ptr", is_constexpr=False, do_not_specialize=False, do_not_specialize_on_alignment=False),
        P(name="n", is_constexpr=False, do_not_specialize=False, do_not_specialize_on_alignment=True),
    ]
    x = torch.zeros(64)

    def key(*args):
        return L._variant((kern, args, {}))

    assert key(x[1:], x, 32) == key(x, x, 33)  # x's offset and n's % 16 are not specialised on
    assert key(x, x[1:], 32) != key(x, x, 32)  # y's alignment is
    assert key(x, x, 1) != key(x, x, 2)  # == 1 still is

    import triton.language as tl

    def fn(a_ptr, b, C: tl.constexpr):
        pass

    interpreted = P(fn=fn, kwargs={"do_not_specialize": ["b"], "do_not_specialize_on_alignment": [0]})
    kinds = L.param_kinds(interpreted)
    assert kinds["a_ptr"] == L.ParamKind(no_align=True) and kinds["b"] == L.ParamKind(do_not_specialize=True)
    assert kinds["C"] == L.ParamKind(constexpr=True)


def test_a_warm_cache_loads_on_the_calling_thread_until_a_variant_compiles(tmp_path):
    """The first compile_all of a set of variants leaves a marker in the cache directory; the next loads them one
    by one on the calling thread (no pool contending for the GIL) and hands the rest to the pool at the first
    variant that compiles instead of loading (what Triton's listener tells: kernels/compile_log.py)."""
    from multilora_cli.kernels.compile_log import compile_log

    log = compile_log()
    if not log.supported:
        pytest.skip("Triton without the compile listener: always the pool")

    class Cached(FakeKernel):
        def __init__(self, missing=()):
            super().__init__()
            self.missing = set(missing)

        def warmup(self, *args, grid, **kwargs):
            super().warmup(*args, grid=grid, **kwargs)
            log.record("fake", 0.0, cache_hit=kwargs["V"] not in self.missing)  # as Triton's listener would

    me = threading.get_ident()
    calls = lambda k: [(k, (torch.zeros(4), 3), {"V": i}) for i in range(6)]  # noqa: E731
    first = Cached()
    assert L.compile_all(calls(first), threads=3, cache_dir=str(tmp_path)) == 6
    assert me not in first.threads, "no marker yet: the pool"
    assert len(list(tmp_path.glob("multilora-precompiled-*"))) == 1
    warm = Cached()
    L.compile_all(calls(warm), threads=3, cache_dir=str(tmp_path))
    assert warm.threads == {me} and len(warm.warmups) == 6, "a warm cache: every load on this thread"
    lost = Cached(missing={2})
    L.compile_all(calls(lost), threads=3, cache_dir=str(tmp_path))
    assert [kw["V"] for _, kw in lost.warmups[:3]] == [0, 1, 2] and len(lost.warmups) == 6
    assert me in lost.threads and len(lost.threads) > 1, "after the miss: the rest from the pool"
    other = Cached()
    L.compile_all([(other, (torch.zeros(4), 3), {"V": 99})], threads=3, cache_dir=str(tmp_path))
    assert me not in other.threads, "other variants: no marker of theirs"
