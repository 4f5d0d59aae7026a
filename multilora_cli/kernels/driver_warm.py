"""Torch's CUDA context and Triton's CUDA driver object built on a background thread while a run does its
pre-flight and imports.

Why: Triton's first compile or launch creates its CUDA driver, whose `cuda_utils` C module is compiled with the
host's C compiler into TRITON_CACHE_DIR on first use (a fresh container: a cold cache) and loaded from there
after; finding libcuda runs `ldconfig -p` either way. Done on the start path's critical path, that is a C compile
and two subprocesses inside the engine's precompile. Started early, the compiler runs (as its own process) while
the main thread reads adapter headers, initialises CUDA for the memory check and imports the engine.

    start()   # after `import torch`: Triton uses torch's device and stream API only if torch is loaded then
    join()    # before the first Triton compile or launch (ModelRunner on CUDA)

No GPU, no compiler, no Triton: the thread ends quietly and the first real use reports the problem as before.
The CUDA context (cuInit, the primary context, the caching allocator: created at the first CUDA tensor) is made
first, on the same thread: the main thread's first CUDA call (the slot budget's memory check, else the model
load) waits for it under torch's lazy-init lock instead of making it after the pre-flight.
"""

from __future__ import annotations

import sys
import threading

_thread: threading.Thread | None = None


def _build() -> None:
    try:
        import torch

        if torch.cuda.is_available():  # the CUDA context and torch's allocator, which the engine's model load made
            torch.zeros(1, device="cuda")
        from triton.runtime import driver

        driver.active.utils  # noqa: B018 (creates the driver: compiles or loads cuda_utils)
    except Exception:  # noqa: BLE001 (reported by the first real use, on the main thread)
        pass


def start() -> None:
    """Build Triton's driver on a daemon thread (once per process; not before torch is imported)."""
    global _thread
    if _thread is not None or "torch" not in sys.modules:
        return
    _thread = threading.Thread(target=_build, name="triton-driver", daemon=True)
    _thread.start()


def join() -> None:
    """Wait for `start`'s thread, if any: Triton's driver is not built twice, nor raced."""
    if _thread is not None:
        _thread.join()
