"""Helpers for the plot tests: what a PNG or SVG file says its size is, the lines a figure draws, and the CLI
run in a process where matplotlib cannot be imported."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"
NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; from multilora_cli.cli import main; main(sys.argv[1:])"
EXTRA_MESSAGE = "error: --plot needs matplotlib, an optional extra: pip install 'multilora[plot]'\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which a valid PNG has first, right after the signature."""
    assert data[:8] == PNG_SIGNATURE, data[:8]
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, (kind, length)
    return struct.unpack(">II", data[16:24])


def svg_size(data: bytes) -> tuple[str, str]:
    """The root <svg>'s width and height attributes (the file must parse as XML)."""
    root = ET.fromstring(data)
    assert root.tag == f"{SVG_NS}svg", root.tag
    return root.get("width"), root.get("height")


def drawn_lines(fig) -> dict[str, tuple[list, list]]:
    """gid -> (x data, y data) of every line the figure's axes draw."""
    return {
        line.get_gid(): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_gid()
    }


def drawn_bars(ax) -> dict[str, list[tuple[float, float]]]:
    """Bar container label -> [(bottom, height)] per bar."""
    return {c.get_label(): [(p.get_y(), p.get_height()) for p in c.patches] for c in ax.containers}


def run_without_matplotlib(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`multilora ARGS` in a fresh interpreter whose `import matplotlib` fails, as where the extra is missing."""
    return subprocess.run(
        [sys.executable, "-c", NO_MATPLOTLIB, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )
