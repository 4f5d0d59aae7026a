"""--resume: keep an interrupted run's finished records, prove they answer this run, run only the rest.

An output written by `OrderedWriter` is a prefix of the full output: record k answers the k-th non-blank input
line. `scan_output` finds the complete-line prefix (a torn last line from a kill is dropped); `verify_prefix`
walks the records beside the input's lines and refuses (exit 1) on the first one that does not match, so a
resume against some other input's output can never mix two runs. Nothing is modified until verification passed.
Ids alone prove little; the ledger beside the output (io/ledger.py) ties each record to its line and settings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from multilora_cli.errors import OutputError
from multilora_cli.io.formats import Format
from multilora_cli.io.ledger import HINT, Fingerprint, LedgerReader
from multilora_cli.io.line import LineSpec
from multilora_cli.paths import expand_user

CHUNK = 1 << 16


@dataclass(slots=True)
class ResumePlan:
    """What is on disk: `valid_bytes` of whole lines, then `torn_bytes` of an unfinished last line."""

    path: Path
    exists: bool
    valid_bytes: int = 0
    torn_bytes: int = 0
    kept: int = 0  # records kept (set by verify_prefix)
    kept_errors: int = 0
    ledger_bytes: int = 0  # the verified ledger's header + `kept` lines; 0 = write a fresh ledger
    unverified: bool = False  # records kept on their ids alone: the output has no ledger


def scan_output(path: str) -> ResumePlan:
    """Locate the last newline of `path` by reading backwards (the file can be huge)."""
    p = expand_user(path)
    if not p.exists():
        return ResumePlan(p, exists=False)
    if p.is_dir():
        raise OutputError(f"output {path} is a directory; give a file path")
    try:
        with open(p, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            end = size
            while end > 0:
                start = max(0, end - CHUNK)
                f.seek(start)
                i = f.read(end - start).rfind(b"\n")
                if i >= 0:
                    valid = start + i + 1
                    return ResumePlan(p, True, valid, size - valid)
                end = start
            return ResumePlan(p, True, 0, size)
    except OSError as e:
        raise OutputError(f"cannot read {path} to resume it: {e.strerror or e}") from e


def _records(plan: ResumePlan) -> Iterator[tuple[int, bytes]]:
    """(1-based record number, raw line) of the complete-line prefix."""
    with open(plan.path, "rb") as f:
        left = plan.valid_bytes
        for n, line in enumerate(f, 1):
            if left <= 0:
                return
            left -= len(line)
            yield n, line


def verify_prefix(
    plan: ResumePlan,
    specs: Iterator[LineSpec],
    fmt: Format,
    errors_sink: BinaryIO | None = None,
    fingerprint: Fingerprint | None = None,
) -> ResumePlan:
    """Consume one input spec per kept record and check they match; copy kept error records to `errors_sink`.

    Without `fingerprint` only the ids are compared. With it (a run), the output's ledger must also match:
    settings, line bytes and adapter per record. An output without a ledger (written before ledgers existed, or
    copied without it) is kept on its ids only when every kept record has an id of its own (`id` /
    `custom_id`), and `plan.unverified` is set so the run warns: refusing would throw away hours of finished
    records whose ids do tie them to their lines. Records numbered by line number carry no such evidence (any
    file's line 1 has id 1), so those are refused.

    Raises OutputError naming the first mismatch. On success `plan.kept` / `plan.kept_errors` are set.
    """
    where = plan.path
    ledger = LedgerReader(plan, fingerprint) if fingerprint is not None else None
    try:
        for n, line in _records(plan) if plan.exists else ():
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            if not isinstance(rec, dict) or not fmt.looks_like_record(rec):
                raise OutputError(
                    f"--resume: {where} line {n} is not a multilora record of the {fmt.name} "
                    "format; it was not written by this run's input format",
                    hint=HINT,
                )
            spec = next(specs, None)
            if spec is None:
                raise OutputError(
                    f"--resume: {where} has more records ({n}+) than the input has lines; "
                    "it was written from a different input",
                    hint=HINT,
                )
            got = fmt.record_id(rec)
            if got != spec.id or type(got) is not type(spec.id):
                raise OutputError(
                    f"--resume: {where} record {n} has id {json.dumps(got)} but input line "
                    f"{spec.lineno} has id {json.dumps(spec.id)}; the output was written from a "
                    "different input",
                    hint=HINT,
                )
            if ledger is not None:
                if ledger.f is not None:
                    if n == 1:
                        ledger.check_header(spec.lineno)
                    ledger.check(n, spec)
                else:
                    fingerprint.tag(spec)  # keep tag()'s once-per-line contract
                    default = fmt.default_id(spec.lineno)
                    if spec.id is None or (spec.id == default and type(spec.id) is type(default)):
                        raise OutputError(
                            f"--resume: {where} has no ledger {ledger.path} and its record {n} "
                            f"(input line {spec.lineno}) has no id of its own, so nothing shows "
                            "it answers this input",
                            hint=HINT,
                        )
                    plan.unverified = True
            if fmt.is_error_record(rec):
                plan.kept_errors += 1
                if errors_sink is not None:
                    errors_sink.write(line)
            plan.kept = n
    finally:
        if ledger is not None:
            ledger.close()
    if ledger is not None and ledger.f is not None and plan.kept:
        plan.ledger_bytes = ledger.pos
    return plan


def truncate_torn(plan: ResumePlan) -> None:
    """Drop the torn last line (if any) so appended records start on a fresh line."""
    if plan.exists and plan.torn_bytes:
        try:
            os.truncate(plan.path, plan.valid_bytes)
        except OSError as e:
            raise OutputError(f"cannot truncate {plan.path} to resume it: {e.strerror or e}") from e
