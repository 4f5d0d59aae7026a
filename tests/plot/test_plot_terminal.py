"""The terminal view's sparklines: one block per value, scaled from 0 to the largest (or a given top)."""

from __future__ import annotations

from multilora_cli.plot.terminal import sparkline


def test_sparkline_scales_from_zero():
    assert sparkline([0, 1, 2, 4, 8]) == "▁▂▃▅█"
    assert sparkline([1, 2], top=8) == "▂▃"
    assert sparkline([0, 0]) == "▁▁" and sparkline([]) == ""
    assert sparkline([None, 4]) == " █"
