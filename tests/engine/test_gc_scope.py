"""engine/gc_scope.py: the heap alive when a generate loop starts is frozen while it runs, and only then."""

from __future__ import annotations

import gc

from multilora_cli.engine.gc_scope import frozen_heap


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic GC frees it


def test_frozen_while_inside_and_nested_scopes_unfreeze_once():
    assert gc.get_freeze_count() == 0
    keep = [_Node() for _ in range(10)]
    with frozen_heap():
        assert gc.get_freeze_count() >= len(keep)
        with frozen_heap():  # a second loop (another engine) inside: still frozen when it leaves
            pass
        assert gc.get_freeze_count() >= len(keep)
    assert gc.get_freeze_count() == 0


def test_a_cycle_frozen_by_the_loop_is_collected_after_it():
    """Nothing leaks: garbage among the frozen objects goes at the first full collection after the loop."""
    import weakref

    node = _Node()
    ref = weakref.ref(node)
    with frozen_heap():
        del node
        gc.collect()
        assert ref() is not None  # frozen: the loop's collections skip it
    gc.collect()
    assert ref() is None


def test_an_error_inside_still_unfreezes():
    try:
        with frozen_heap():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.get_freeze_count() == 0
