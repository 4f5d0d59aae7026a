"""`--plot FILE`: the checks made before any work (format by suffix, matplotlib installed, file writable) and
the write at the end.

matplotlib is an optional extra (`multilora[plot]`): only `--plot` needs it, so it is imported here, lazily, and
its absence is one line naming the extra (exit 1) before a report is computed or a benchmark row is run.
"""

from __future__ import annotations

from dataclasses import dataclass

from multilora_cli.errors import MultiloraError, OutputError, UsageError

EXTRA = "pip install 'multilora[plot]'"
MATPLOTLIB_MIN = (3, 7)  # keep in step with the `plot` extra in pyproject.toml
FORMATS = {".png": "png", ".svg": "svg"}


class MissingExtraError(MultiloraError):
    """An optional dependency that a flag needs is not installed (exit 1)."""

    code = "missing_extra"


def require_matplotlib() -> None:
    """Import matplotlib, or say in one line which extra installs it."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(f"--plot needs matplotlib, an optional extra: {EXTRA}") from None
    version = tuple(int(p) for p in matplotlib.__version__.split(".")[:2] if p.isdigit())
    if version < MATPLOTLIB_MIN:
        need = ".".join(map(str, MATPLOTLIB_MIN))
        raise MissingExtraError(f"--plot needs matplotlib>={need}, found {matplotlib.__version__}: {EXTRA}")


@dataclass(slots=True, frozen=True)
class PlotTarget:
    """Where a plot goes and in which format ("png" | "svg", from the file's suffix)."""

    path: str
    format: str

    def __post_init__(self) -> None:
        if self.format not in FORMATS.values():
            raise UsageError(f"--plot format must be png or svg, got {self.format!r}")

    def write(self, data: bytes) -> None:
        """Write the rendered bytes (a descriptor or FIFO name is written where it is, as run's outputs are)."""
        from multilora_cli.io.sink import in_place, open_in_place, real_file

        try:
            if in_place(self.path):
                with open_in_place(self.path) as f:
                    f.write(data)
            else:
                real_file(self.path).write_bytes(data)
        except OSError as e:
            raise OutputError(f"cannot write plot {self.path}: {e.strerror or e}") from None


def prepare_plot(path: str) -> PlotTarget:
    """Check a `--plot` path before any work: suffix .png or .svg (usage error, exit 2), matplotlib importable
    and the file writable (one line, exit 1)."""
    from multilora_cli.io.writer import check_writable
    from multilora_cli.paths import expand_user

    suffix = expand_user(path).suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"--plot {path}: the file name must end in .png or .svg (the format follows the suffix)")
    require_matplotlib()
    check_writable(path, "plot")
    return PlotTarget(path, FORMATS[suffix])
