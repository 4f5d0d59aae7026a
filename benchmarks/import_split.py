"""Where a process's import seconds go, from the stderr of `python -X importtime`: torch, triton, the rest.

`python -X importtime` prints one line per module imported, children before their parent:

    import time: self [us] | cumulative | imported package
    import time:       173 |        173 |   _io
    import time:      1236 |    1017412 |       torch

with two spaces of indent per nesting level. A module is counted once, under the first import that loaded it,
so the split is exclusive: `torch_s` is every module loaded while `import torch` ran (its numpy, its stdlib
modules), `triton_s` the same for triton's imports outside torch's, `rest_s` everything else (the interpreter's
start-up modules, typer, our own modules, tokenizers, jinja2...); the three add up to `total_s`. `top_rest`
names the largest first-level imports of the rest (cumulative, less the torch / triton inside them), `top_torch`
the largest imports inside `import torch` (its own module body is `torch` itself: the shared libraries its
torch._C loads count under torch._C).
"""

from __future__ import annotations

import re

LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
GROUPS = ("torch", "triton")


def parse(stderr: str) -> list[tuple[int, int, int, str]]:
    """(self us, cumulative us, depth, module) per importtime line, in printed order."""
    rows = []
    for line in stderr.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((int(m[1]), int(m[2]), len(m[3]) // 2, m[4]))
    return rows


def group_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in GROUPS else None


def split(stderr: str, top: int = 8) -> dict:
    """{"torch_s", "triton_s", "rest_s", "total_s", "modules", "top_rest": [[module, s], ...]} of one process's
    `-X importtime` stderr; {} when it holds no importtime lines."""
    rows = parse(stderr)
    if not rows:
        return {}
    # each line's parent is the next line printed at a smaller depth (children print before their parent)
    parent: list[int | None] = [None] * len(rows)
    pending: list[int] = []
    for i, (_, _, depth, _) in enumerate(rows):
        while pending and rows[pending[-1]][2] > depth:
            parent[pending.pop()] = i
        pending.append(i)
    children: dict[int | None, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)

    sums = dict.fromkeys(GROUPS, 0)
    inside_torch: list[tuple[int, str]] = []  # (cumulative us, module) of the imports `import torch` made

    def rest_of(i: int) -> int:
        """Microseconds of node i's subtree outside torch / triton subtrees (those go to `sums`)."""
        own, cum, _, name = rows[i]
        g = group_of(name)
        if g is not None:
            sums[g] += cum
            if g == "torch":
                inside_torch.extend((rows[c][1], rows[c][3]) for c in children.get(i, []))
                inside_torch.append((own, name))
            return 0
        return own + sum(rest_of(c) for c in children.get(i, []))

    firsts = [(rest_of(i), rows[i][3]) for i in children.get(None, [])]
    rest = sum(us for us, _ in firsts)
    s = lambda us: round(us / 1e6, 3)  # noqa: E731
    return {
        "torch_s": s(sums["torch"]),
        "triton_s": s(sums["triton"]),
        "rest_s": s(rest),
        "total_s": s(rest + sums["torch"] + sums["triton"]),
        "modules": len(rows),
        "top_rest": [[name, s(us)] for us, name in sorted(firsts, reverse=True)[:top]],
        "top_torch": [[name, s(us)] for us, name in sorted(inside_torch, reverse=True)[:top]],
    }
