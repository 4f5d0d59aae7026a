"""The mixed-batch check the engine tests share: a batch of rows under different adapters gives the expected
tokens, and each row run alone gives what it gives in the batch (a row's output never depends on its neighbours)."""

from __future__ import annotations

from collections.abc import Callable

from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request


def assert_batch_and_rows_alone(engine: Engine, requests: Callable[[], list[Request]], want: list[list[int]]) -> None:
    """`requests()` builds fresh requests (a run consumes them); `want`: each row's expected token ids."""
    got = engine.generate_all(requests())
    assert [r.error for r in got] == [None] * len(want)
    assert [r.token_ids for r in got] == want
    alone = [engine.generate_all([r])[0].token_ids for r in requests()]
    assert alone == [r.token_ids for r in got]
