"""Tiny bases and PEFT-written adapters (tests/builders.py) for the adapter tests, built lazily and cached by name."""

from __future__ import annotations

from pathlib import Path

from tests import builders


class Zoo:
    """Lazily built bases and adapters, cached by name for the whole session."""

    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[str, Path] = {}

    def base(self, name: str, arch: str = "llama", **overrides) -> Path:
        key = f"base-{name}"
        if key not in self._cache:
            self._cache[key] = builders.build_base(self.root / key, arch, **overrides)
        return self._cache[key]

    def adapter(self, name: str, base: Path, **kw) -> Path:
        key = f"adapter-{name}"
        if key not in self._cache:
            self._cache[key] = builders.build_adapter(base, self.root / key, **kw)
        return self._cache[key]
