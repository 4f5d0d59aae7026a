"""The report: assumptions, then sections of figures, each with the value and how it follows.

One structure feeds both outputs: rich tables for humans and `to_dict()` for `--json`, so every printed number
is also in the JSON and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multilora_cli.economics.scenario import Assumption


@dataclass(slots=True)
class Figure:
    key: str
    label: str
    value: object  # int | float | str | bool | None: the machine value
    shown: str  # the human value
    how: str  # how it follows from the assumptions, with the numbers filled in


@dataclass(slots=True)
class Section:
    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)

    def add(self, key: str, label: str, value, shown: str, how: str = ""):
        """Record a figure; returns `value` so computations read naturally."""
        self.figures.append(Figure(key, label, value, shown, how))
        return value

    def __getitem__(self, key: str):
        return next(f.value for f in self.figures if f.key == key)


@dataclass(slots=True)
class Report:
    assumptions: list[Assumption]
    modules: list[dict]  # per-module adapter rows
    sections: list[Section]
    warnings: list[str] = field(default_factory=list)
    summary: str = ""

    def section(self, key: str) -> Section:
        return next(s for s in self.sections if s.key == key)

    def to_dict(self) -> dict:
        """One JSON-ready object: every assumption (with source) and every figure (with its explanation)."""
        out: dict = {
            "summary": self.summary,
            "assumptions": {
                a.key: {"value": a.value, "unit": a.unit, "source": a.source, "note": a.note} for a in self.assumptions
            },
            "adapter_modules": self.modules,
        }
        for s in self.sections:
            out[s.key] = {f.key: f.value for f in s.figures}
        out["explanations"] = {f"{s.key}.{f.key}": f.how for s in self.sections for f in s.figures if f.how}
        out["warnings"] = list(self.warnings)
        return out
