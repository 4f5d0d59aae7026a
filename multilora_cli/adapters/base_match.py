"""Does the --model given name the base an adapter was trained on? A warning, never a refusal.

Shapes are checked elsewhere (adapters/scan.py): an adapter whose shapes fit runs. But a shape-compatible base
can still be the wrong one (an adapter trained on an -Instruct model run on the pretrained base, a v0.1 adapter
on v0.2), and the output is then quietly worse. `base_model_name_or_path` is the only record of the base, in
forms that differ for the same model: a Hub id, a local copy named after it, a Hub cache snapshot
(.../models--org--name/snapshots/<sha>), an absolute path on the training machine. So names are compared by
their model name (last component, `@revision` dropped, case folded), and a path that exists here by identity.
"""

from __future__ import annotations

from pathlib import Path

from multilora_cli.paths import expand_user


def model_key(spec: str) -> str:
    """The model name a base spec refers to: "org/Name@rev", "/x/Name", ".../models--org--Name/snapshots/abc"
    -> "name"."""
    parts = [p for p in spec.strip().replace("\\", "/").split("/") if p]
    for part in reversed(parts):
        if part.startswith("models--"):  # a Hub cache folder: models--{org}--{name}
            return part.split("--")[-1].lower()
    return parts[-1].partition("@")[0].lower() if parts else ""


def same_base(declared: str, given: str, given_path: Path) -> bool:
    """Whether an adapter's declared base and the --model given (resolved to given_path) are the same model."""
    p = expand_user(declared)
    try:
        if p.is_absolute() and p.exists() and p.resolve() == given_path.resolve():
            return True
    except OSError:
        pass
    # by name also for a path that exists here: a copy of the base under the same name is the same model
    return model_key(declared) in (model_key(given), model_key(str(given_path)))


def mismatch_warnings(declared: dict[str, str | None], given: str, given_path: Path) -> list[str]:
    """One line per declared base that is not the --model given, naming its adapters (at most 3, then a count).
    declared: adapter name -> its base spec (None: the config names none, nothing to compare)."""
    by_base: dict[str, list[str]] = {}
    for name, base in declared.items():
        if base and not same_base(base, given, given_path):
            by_base.setdefault(base, []).append(name)
    out = []
    for base, names in by_base.items():
        listed = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        one = len(names) == 1
        out.append(
            f"{'adapter' if one else 'adapters'} {listed} {'names' if one else 'name'} base model {base!r} "
            f"in adapter_config.json, not the --model {given!r} {'it runs' if one else 'they run'} on "
            "(the shapes fit)"
        )
    return out
