"""The output files of a `multilora run`, in two steps around the engine's start.

`check`, before the model loads (a problem costs no load time): -o, --errors and --stats can be written, and
with --resume the kept prefix of -o belongs to this input. `open`, once the engine is up: truncate (or append
to) -o, write its ledger, copy the kept error records to --errors. A run that cannot start (a --max-model-len
only the engine checks, a GPU out of memory, Ctrl-C while loading) so leaves the last run's output and ledger as
they were; opening them first had emptied a finished -o before failing.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

from multilora_cli.io.formats import Format
from multilora_cli.io.ledger import ledger_path, open_ledger
from multilora_cli.io.line import LineSpec
from multilora_cli.io.resume import ResumePlan, scan_output, truncate_torn, verify_prefix
from multilora_cli.io.writer import OrderedWriter, check_writable, open_output
from multilora_cli.paths import expand_user
from multilora_cli.run.config import RunConfig
from multilora_cli.run.ledger import RunLedger, resumable_output
from multilora_cli.run.setup import note


class RunOutputs:
    """`ledger`: the run's RunLedger for an -o FILE run (else None); `open` drops it where the output cannot keep
    one (-o /dev/null, a FIFO, /dev/stdout). `resumable`: the output is a file a later --resume can read back."""

    def __init__(self, cfg: RunConfig, ledger: RunLedger | None):
        self.cfg = cfg
        self.ledger = ledger
        self.resumable = False
        self.plan = ResumePlan(Path("-") if ledger is None else expand_user(cfg.output), exists=False)
        self._kept_errors = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # for --errors, until it is opened

    def check(self, specs: Iterator[LineSpec], fmt: Format) -> ResumePlan:
        """Fail now if an output cannot be written; with --resume verify the kept prefix (consuming its specs)."""
        cfg = self.cfg
        if cfg.output in (None, "-"):
            open_output(cfg.output)  # a closed stdout is refused now; opening stdout changes nothing
        else:
            check_writable(cfg.output, "output")
        if cfg.stats:
            check_writable(cfg.stats, "stats file")
        if cfg.errors:
            check_writable(cfg.errors, "errors file")
        if not cfg.resume:
            return self.plan
        plan = self.plan = verify_prefix(
            scan_output(cfg.output),
            specs,
            fmt,
            self._kept_errors,
            self.ledger.fingerprint if self.ledger is not None else None,
        )
        truncate_torn(plan)
        if plan.unverified:
            note(
                f"warning: {cfg.output} has no --resume ledger {ledger_path(cfg.output)} (written by an "
                f"older multilora, or copied without it): its {plan.kept} records were checked by id "
                "only, not by prompt or settings"
            )
        if plan.exists:
            note(
                f"resuming {cfg.output}: {plan.kept} records kept"
                + (f", dropped a torn last line of {plan.torn_bytes} bytes" if plan.torn_bytes else ""),
                cfg.quiet,
            )
        else:
            note(f"--resume: {cfg.output} does not exist yet; starting from the first line", cfg.quiet)
        return plan

    def open(self) -> OrderedWriter:
        """Open -o (truncating it unless --resume), its ledger and --errors; the writer of the run's records."""
        cfg, plan = self.cfg, self.plan
        with self._kept_errors:
            out, out_name = open_output(cfg.output, append=cfg.resume)
            ledger = None
            self.resumable = resumable_output(cfg.output, out)
            if self.ledger is not None and self.resumable:  # not for -o /dev/null, a FIFO or /dev/stdout
                ledger = open_ledger(plan, self.ledger.fingerprint)
            if ledger is None:  # records go out without ledger lines
                self.ledger = None
            errors, err = None, "<errors>"
            if cfg.errors:
                errors, err = open_output(cfg.errors, what="errors file")
                self._kept_errors.seek(0)
                errors.write(self._kept_errors.read())
        return OrderedWriter(out, errors, start_key=plan.kept, out_name=out_name, ledger=ledger, errors_name=err)

    def close(self) -> None:
        self._kept_errors.close()
