"""Every Triton launch of the package goes through `launch`, so a forward can be dry-run to learn which kernel
variants it needs, and those variants compiled in parallel before anything runs.

Why: a cold process (empty TRITON_CACHE_DIR, e.g. a fresh container) compiled ~44 kernel variants one after
another inside the decode-graph warm-ups and the first prefill steps, ~15 s of a 35 s one-shot Llama-3-8B run on
an H200 host (benchmarks/RESULTS.md, cold start). Compiles from threads mostly overlap: 8 variants took 1.83 s
one by one and 0.49 s from 8 threads on that host.

    with collect() as calls:      # Triton launches inside are recorded, not run (torch ops still run)
        model(ids, positions)
    compile_all(calls)            # kernel.warmup(...) per distinct variant, in a thread pool

Inside `collect` the outputs of Triton kernels are left unwritten, so a dry run must not read its results.
A recorded launch keeps no tensor alive: each tensor argument is replaced by a one-element stand-in with what
Triton specialises on (dtype, device, 16-byte alignment of the address). Holding the real arguments kept every
activation of every dry-run forward until the compile: ~94 GiB for Llama-3-8B's dry prefills up to 8,192 tokens,
an out-of-memory error at engine start on an H200 once the KV cache and a rank-64 slot pool were allocated.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

_calls: list | None = None
_run = False  # collect(run=True): recorded launches run too
_stand_ins: dict = {}


def stand_in(t: torch.Tensor) -> torch.Tensor:
    """A one-element tensor Triton compiles alike: t's dtype and device, and an address with t's remainder
    mod 16 (cached per such class, so recording allocates almost nothing)."""
    rem = t.data_ptr() % 16
    key = (t.dtype, t.device, rem)
    s = _stand_ins.get(key)
    if s is None:
        size = t.element_size()
        buf = torch.empty(16 // size + 1, dtype=t.dtype, device=t.device)  # allocator blocks: 16-byte aligned
        s = _stand_ins[key] = buf[rem // size : rem // size + 1]
    return s


def _light(v):
    return stand_in(v) if isinstance(v, torch.Tensor) else v


def launch(kernel, grid, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`, or only recorded inside `collect()` (tensors as `stand_in`s); inside
    `collect(run=True)` recorded and run."""
    if _calls is not None:
        _calls.append((kernel, tuple(_light(a) for a in args), {k: _light(v) for k, v in kwargs.items()}))
        if not _run:
            return
    kernel[grid](*args, **kwargs)


@contextmanager
def collect(run: bool = False):
    """Record the Triton launches made inside (not nestable); yields the list they are appended to. `run`: the
    launches also run (a real step's variants, to compare with a dry run's: tests/engine/test_precompile_cover.py)."""
    global _calls, _run
    if _calls is not None:
        raise RuntimeError("launch.collect() is already active")
    _calls, _run = [], run
    try:
        yield _calls
    finally:
        _calls, _run = None, False


@dataclass(frozen=True, slots=True)
class ParamKind:
    """What Triton specialises a kernel parameter on: constexprs by value; other ints (== 1, % 16) and tensors (16-byte
    alignment) by class, unless `do_not_specialize` (neither) or `no_align` (no % 16 / alignment class)."""

    constexpr: bool = False
    do_not_specialize: bool = False
    no_align: bool = False


def param_kinds(kernel) -> dict[str, ParamKind]:
    """{name: ParamKind} of a JITFunction's parameters (its `params`), or of an interpreted kernel
    (TRITON_INTERPRET=1: read off its signature's annotations and jit arguments); {} for anything else."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return {
            p.name: ParamKind(p.is_constexpr, p.do_not_specialize, getattr(p, "do_not_specialize_on_alignment", False))
            for p in params
        }
    fn, jit_kw = getattr(kernel, "fn", None), getattr(kernel, "kwargs", None)
    if fn is None or not isinstance(jit_kw, dict):
        return {}
    names = list(inspect.signature(fn).parameters)
    listed = lambda key: {names[i] if isinstance(i, int) else i for i in jit_kw.get(key) or ()}  # noqa: E731
    dns, dna = listed("do_not_specialize"), listed("do_not_specialize_on_alignment")
    return {
        n: ParamKind("constexpr" in str(p.annotation), n in dns, n in dna)
        for n, p in inspect.signature(fn).parameters.items()
    }


def _variant(call) -> tuple:
    """A key equal for launches Triton compiles alike: the kernel, constexprs and launch options by value, tensors
    by dtype and 16-byte alignment, other ints by the classes Triton specialises on (== 1, % 16, 32-bit), as
    `param_kinds` says per parameter. Without parameter kinds a positional int counts by class and a keyword by
    value."""
    kernel, args, kwargs = call
    kinds = param_kinds(kernel)
    names = list(kinds)

    def spec(v, name, by_value):
        k = kinds.get(name)
        if isinstance(v, torch.Tensor):
            if k is not None and (k.do_not_specialize or k.no_align):
                return (v.dtype,)
            return (v.dtype, v.data_ptr() % 16 == 0)
        if isinstance(v, bool) or not isinstance(v, int) or (k.constexpr if k is not None else by_value):
            return v
        fits = -(1 << 31) <= v < (1 << 31)
        if k is not None and k.do_not_specialize:
            return ("int", fits)
        return ("int", v == 1, (k is None or not k.no_align) and v % 16 == 0, fits)

    pos = tuple(spec(a, names[i] if i < len(names) else None, False) for i, a in enumerate(args))
    return (id(kernel), pos, tuple(sorted((k, spec(v, k, True)) for k, v in kwargs.items())))


def _stable_key(call) -> str:
    """`_variant`'s key with the kernel named by module, name and source hash (JITFunction.cache_key) instead of
    its id: the same in every process, for the precompile marker."""
    kernel = call[0]
    fn = getattr(kernel, "fn", kernel)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(kernel).__name__)}"
    return repr((name, getattr(kernel, "cache_key", ""), *_variant(call)[1:]))


def _marker(calls: list, cache_dir: str | None) -> Path | None:
    """A file in Triton's cache directory named by the hash of these variants (and Triton's and torch's versions):
    it exists once they were all compiled into that cache. None without a cache directory."""
    if cache_dir is None:
        try:
            from triton import knobs

            cache_dir = knobs.cache.dir
        except (ImportError, AttributeError):
            cache_dir = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    if not cache_dir:
        return None
    import triton

    keys = sorted(_stable_key(c) for c in calls)
    digest = hashlib.sha256(repr((triton.__version__, torch.__version__, keys)).encode()).hexdigest()[:32]
    return Path(cache_dir) / f"multilora-precompiled-{digest}"


def _cuda_device(call) -> torch.device | None:
    """The CUDA device of a recorded launch's first CUDA tensor (its stand-in keeps the device): a pool thread
    compiles and loads for that device, not for the thread's default one."""
    _, args, kwargs = call
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return v.device
    return None


def compile_all(calls: list, threads: int | None = None, cache_dir: str | None = None) -> int:
    """Compile (or load from Triton's cache) every distinct variant among `calls`, in parallel; returns how
    many were submitted. Launches afterwards find them in Triton's in-memory cache, loaded onto their GPU with
    their launchers built.

    A warm cache (a marker file says these variants were all compiled into `cache_dir`, Triton's by default) is
    loaded on this thread, one variant after another: Triton's cache lookups are Python work under the GIL, which
    a pool only contends for (an H200 host, the demo warm: 19 loads inside the steps took 0.027 s in all, the 52
    at start 9.4 s summed over 15 threads, in a 1.24 s precompile). At the first variant that is compiled rather
    than loaded (the cache lost it), the rest go to the pool. Without Triton's compile listener
    (kernels/compile_log.py) a miss cannot be told from a load: always the pool."""
    unique = {}
    for call in calls:
        unique.setdefault(_variant(call), call)
    if not unique:
        return 0
    # longest first (a kernel's source length stands for its compile time): the pool's last wave is then short
    # compiles, not the sampler's large ones started last while the other threads sit idle
    items = sorted(unique.values(), key=lambda c: -len(getattr(c[0], "src", "") or ""))

    def warm(call):
        kernel, args, kwargs = call
        device = _cuda_device(call)
        with torch.cuda.device(device) if device is not None else nullcontext():
            compiled = kernel.warmup(*args, grid=(1,), **kwargs)
            # A compile leaves the binary off the GPU and its launcher unbuilt until the first launch; the launcher
            # is a C module built with the host's compiler per signature. Left to the steps, a cold demo run built
            # 14 of them one after another inside generate (4.4 s of a 17.7 s run); here they build in the pool.
            init = getattr(compiled, "_init_handles", None)
            if device is not None and callable(init):
                init()

    from multilora_cli.kernels.compile_log import compile_log

    marker = _marker(items, cache_dir)
    log = compile_log()
    if marker is not None and marker.exists() and log.supported:
        done = 0
        for call in items:
            before = log.snapshot().compiled
            warm(call)
            done += 1
            if log.snapshot().compiled > before:
                break  # compiled, not loaded: the cache is not warm after all
        items = items[done:]
    if items:
        n = threads or min(len(items), max(1, (os.cpu_count() or 2) - 1), 16)
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(warm, items))  # re-raises the first compile error
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:  # a read-only cache: loads from the pool, as before
            pass
    return len(unique)
