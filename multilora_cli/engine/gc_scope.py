"""`frozen_heap`: the heap that exists when a generate loop starts is left out of Python's cyclic GC while it runs.

Why: a generate loop allocates steadily (batches, sequences, results), so the collector runs its oldest
generation now and then, and a full collection walks every tracked object in the process: the model's modules,
the tokenizer, and with 1,000 adapters their read plans (~190 tracked objects each, engine/direct_read.py). In the
1,000-adapter bench that was one collection of the whole heap inside the timed run (gc_s 0.47 s with 236 / 21 / 1
collections of generations 0 / 1 / 2; issue 38); on a CPU, one full collection of a 430k-object heap took 0.6 s.
`gc.freeze()` moves every object alive now to a permanent generation that collections skip, so the loop's
collections walk only what the loop allocated; `gc.unfreeze()` at the end hands them back to the oldest
generation, so nothing frozen outlives the loop: garbage among them (a cycle that died during the loop) is
collected at the next full collection after it, as it would have been, only later.
Reference counting frees acyclic objects as usual, frozen or not. Nested or concurrent loops (two engines in
one process) freeze once; the last one out unfreezes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # generate loops inside `frozen_heap` now (process-wide, as the collector is)


@contextmanager
def frozen_heap() -> Iterator[None]:
    global _depth
    with _lock:
        if _depth == 0:
            gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.unfreeze()
