"""The --resume ledger: what ties each record of an output to the input line and settings it answers.

Ids alone prove little (without an `id` field they are line numbers, the same in any file), so a run that
writes `-o FILE` also writes the ledger `FILE.resume` beside it:
  line 1: {"multilora_resume": 1, "settings": {...}}: what changes outputs besides the line itself (the base
          model's files, dtype, load format, --max-model-len, the run seed, the effective sampling defaults:
          --max-tokens / --temperature / --top-p / --top-k over the model's generation_config.json)
  then one "<line hash> <adapter hash>" per record, in output order: the input line's bytes, and the files (or
          pre-flight failure) of the adapter it names.
Each ledger line is written and flushed before its record, so after a kill the ledger is never behind the
output. --resume recomputes both and refuses on the first kept record whose settings, line or adapter differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from multilora_cli.adapters.identity import folder_digest
from multilora_cli.errors import OutputError
from multilora_cli.io.line import LineSpec
from multilora_cli.paths import expand_user

HINT = "drop --resume to overwrite it, or choose another -o"
LEDGER_SUFFIX = ".resume"
LEDGER_VERSION = 1
# What the engine reads from a model folder (engine/tokenizer.py, models/loader.py; adapters: ADAPTER_FILES):
# other files there (README, training checkpoints) do not change outputs and may come and go.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
)


@dataclass(slots=True)
class Fingerprint:
    """What a record depends on: the run's `settings` (the ledger header) and `tag(spec)`, its ledger line
    ("<line hash> <adapter hash>"). `tag` is called exactly once per input line, in input order."""

    settings: dict
    tag: Callable[[LineSpec], str]
    # what serves adapter NAME in this run, in words, for the message when a kept record's adapter differs
    adapter_now: Callable[[str | None], str]

    def header(self) -> bytes:
        return (
            json.dumps({"multilora_resume": LEDGER_VERSION, "settings": self.settings}, sort_keys=True) + "\n"
        ).encode()


def ledger_path(output: str | Path) -> Path:
    """The ledger of output FILE: FILE.resume beside it."""
    p = expand_user(output)
    return p.with_name(p.name + LEDGER_SUFFIX)


def short_hash(data: bytes) -> str:
    """16 hex digits: enough to tell two requests apart, short enough for a ledger line per record."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def line_hash(raw: bytes) -> str:
    """Hash of one input line; surrounding whitespace (a final newline added later, CRLF) does not count."""
    return short_hash(raw.strip())


def folder_fingerprint(folder: str | Path, names: tuple[str, ...], suffix: str | None = None) -> str:
    """Hash of the files `names` (and every `*suffix` file) directly in `folder`, by content, not path or
    mtime (adapters/identity.py): a moved model is the same model. Unreadable files raise OutputError naming them."""
    try:
        return folder_digest(folder, names, suffix)
    except OSError as e:
        raise OutputError(f"cannot read {e.filename} to fingerprint the run for --resume: {e.strerror or e}") from e


def _diff(old: Any, new: Any, name: str = "") -> list[str]:
    """Human words for what differs between two settings dicts: "max_tokens 13 -> 3", "model files"."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in _diff(old.get(k), new.get(k), k)]
    if old == new:
        return []
    if name == "model":
        return ["the base model's files"]
    old, new = ("unset" if v is None else json.dumps(v) for v in (old, new))
    return [f"{name} {old} -> {new}"]


class LedgerReader:
    """Reads an output's ledger beside its records during verification."""

    def __init__(self, plan, fp: Fingerprint):  # plan: resume.ResumePlan
        self.out, self.path, self.fp = plan.path, ledger_path(plan.path), fp
        self.f: BinaryIO | None = None
        self.pos = 0
        if plan.exists and self.path.is_file():
            try:
                self.f = open(self.path, "rb")
            except OSError as e:
                raise OutputError(f"cannot read {self.path} to resume {self.out}: {e.strerror or e}") from e

    def _line(self) -> bytes | None:
        """The next whole line, None at the end (a torn line is one the kill cut before its record)."""
        line = self.f.readline()
        if not line.endswith(b"\n"):
            return None
        self.pos += len(line)
        return line

    def check_header(self, lineno: int) -> None:
        """Raise unless the ledger was written under this run's settings."""
        line = self._line()
        try:
            head = json.loads(line) if line is not None else None
        except ValueError:
            head = None
        if (
            not isinstance(head, dict)
            or head.get("multilora_resume") != LEDGER_VERSION
            or not isinstance(head.get("settings"), dict)
        ):
            raise OutputError(
                f"--resume: {self.path} is not a multilora resume ledger, so nothing shows what "
                f"{self.out} was written from",
                hint=HINT,
            )
        now = json.loads(json.dumps(self.fp.settings))  # as the ledger holds it (tuples are lists there)
        changed = _diff(head["settings"], now)
        if changed:
            raise OutputError(
                f"--resume: {self.out} record 1 (input line {lineno}) was written under other "
                f"settings ({', '.join(changed)}), so its records do not answer this run",
                hint=HINT,
            )

    def check(self, n: int, spec: LineSpec) -> None:
        """Raise unless record `n` answers input line `spec` (same line bytes, same adapter files)."""
        line = self._line()
        got = line.decode("ascii", "replace").split() if line is not None else []
        if len(got) != 2:
            raise OutputError(
                f"--resume: {self.path} ends before record {n} of {self.out} (or is damaged), so "
                "the two files do not belong together",
                hint=HINT,
            )
        want = self.fp.tag(spec).split()
        if got[0] != want[0]:
            raise OutputError(
                f"--resume: {self.out} record {n} answers another request than input line "
                f"{spec.lineno} holds now (the request changed since it was written)",
                hint=HINT,
            )
        if got[1] != want[1]:
            raise OutputError(
                f"--resume: {self.out} record {n} (input line {spec.lineno}) was written by "
                f"another adapter {spec.adapter!r}: {self.fp.adapter_now(spec.adapter)}",
                hint=HINT,
            )

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def open_ledger(plan, fingerprint: Fingerprint) -> BinaryIO | None:
    """Open the output's ledger for the records this run appends: after the verified kept lines (a line the
    kill left beyond them is dropped), or fresh with this run's header. None when records were kept without a
    ledger: one that starts midway could not vouch for them."""
    if plan.unverified:
        return None
    path = ledger_path(plan.path)
    try:
        if plan.ledger_bytes:
            f = open(path, "r+b")
            f.truncate(plan.ledger_bytes)
            f.seek(plan.ledger_bytes)
        else:
            f = open(path, "wb")
            f.write(fingerprint.header())
        f.flush()
        return f
    except OSError as e:
        raise OutputError(
            f"cannot write {path} (the --resume ledger of {plan.path}): {e.strerror or e}",
            hint="check the output's directory is writable",
        ) from e
