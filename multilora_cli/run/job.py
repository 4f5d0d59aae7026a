"""The `multilora run` job: JSONL in -> pre-flight -> engine -> JSONL out (in order, resumable) + stats.

Order of work, so every fatal problem surfaces before the model is loaded:
  open INPUT -> validate flags -> pre-flight adapters (+ base model) -> check outputs are writable ->
  detect the format -> (--resume: verify the kept prefix against the input) -> load the engine -> open the
  outputs (only now is -o truncated: a run that cannot start leaves the last one's output) -> stream.
Each non-blank line gets exactly one record: bad lines become error records as they are read, the engine's
results are written through a reorder buffer as soon as they are next in input order. An `-o FILE` run also
keeps FILE.resume, the ledger that lets --resume prove kept records answer the same requests (io/ledger.py).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from multilora_cli.errors import EXIT_OK, EXIT_PARTIAL, EngineError
from multilora_cli.io.formats import parse_line
from multilora_cli.io.line import LineSpec
from multilora_cli.io.progress import make_progress, print_summary
from multilora_cli.io.reader import InputReader, count_records, open_input
from multilora_cli.io.sampling import SamplingResolver
from multilora_cli.io.stats import RunStats, write_stats
from multilora_cli.io.terminal import stop_on_next_signal
from multilora_cli.io.writer import refuse_clobbering
from multilora_cli.run.config import RunConfig, base_aliases
from multilora_cli.run.engine_api import EngineFactory, JobEngine
from multilora_cli.run.ledger import RunLedger, check_ledger_clash
from multilora_cli.run.line_kinds import read_input_facts
from multilora_cli.run.lines import admit, stat_name, to_request, unique_ids
from multilora_cli.run.logprobs import line_logprobs
from multilora_cli.run.outputs import RunOutputs
from multilora_cli.run.plan import EnginePlan
from multilora_cli.run.setup import engine_config, note, preflight_run
from multilora_cli.run.signal_after import SignalAfter


def local_engine(plan: EnginePlan) -> JobEngine:
    """The engine of a single-process run."""
    from multilora_cli.engine.engine import Engine

    return Engine(plan.config, plan.adapters, scans=plan.scans, tokenizer=plan.tokenizer)


class RunJob:
    """One run. `run()` returns the exit code (0 all ok, 3 some error records) or raises MultiloraError.

    engine_factory: builds the engine from the job's EnginePlan once pre-flight passed and there is work; by
    default one Engine in this process (a data-parallel run gives its DistributedEngine's)."""

    def __init__(self, cfg: RunConfig, engine_factory: EngineFactory | None = None):
        self.cfg = cfg
        self._local = engine_factory is None  # no worker processes: a second Ctrl-C may exit at once
        self._engine_factory: EngineFactory = engine_factory or local_engine
        self._signal_after = SignalAfter.from_env()  # tests only (run/signal_after.py)
        self.stats = RunStats()
        self._lock = threading.Lock()  # the engine may pull requests from its own thread
        self._inflight: dict[int, tuple[LineSpec, str | None]] = {}
        self._active: Counter = Counter()
        self._seen: set[str] = set()
        self.engine: JobEngine | None = None
        self._ledger: RunLedger | None = None  # set while records get ledger lines (an -o FILE run)
        self._resumable = False  # the output is a regular file that a later --resume can read back

    # -- setup ----------------------------------------------------------------------------------------------
    def _parse(self, reader: InputReader) -> Iterator[LineSpec]:
        """The reader's specs, noting each raw line's hash while the run keeps a ledger."""
        for key, lineno, raw in reader.raw_lines():
            if self._ledger is not None:
                self._ledger.note_line(key, raw)
            yield parse_line(raw, key, lineno, reader.format)

    # -- streaming ------------------------------------------------------------------------------------------
    def _requests(self, specs: Iterator[LineSpec]):
        for spec in specs:
            if self._ledger is not None:  # before admit: the tag must not depend on what it marks failed
                self._ledger.mark(spec)
            adapter = admit(spec, self._good, self._base_names, self._pf.errors)
            params = self._resolver.resolve(spec) if spec.error is None else None
            if spec.error is not None:
                self._emit_error(spec, spec.error.code, spec.error.one_line())
                continue
            req = to_request(spec, adapter, params)
            with self._lock:
                self._inflight[spec.key] = (spec, adapter)
                self._active[adapter] += 1
            yield req

    def _emit_error(self, spec: LineSpec, code: str, message: str, adapter: str | None = None) -> None:
        record = self._fmt.error_record(spec, code, message)
        with self._lock:
            self.stats.add_error(adapter or stat_name(spec, self._base_names), code)
            self.writer.put(spec.key, record, is_error=True, tag=self._tag(spec.key))
            self._wrote()

    def _tag(self, key: int) -> str | None:
        return self._ledger.pop_tag(key) if self._ledger is not None else None

    def _wrote(self) -> None:
        """After each record handed to the writer (under the lock): the progress line, and the tests' hook."""
        self.progress.update(
            self.writer.written,
            self.stats.errors,
            self.stats.total_tokens,
            sum(1 for a, n in self._active.items() if n > 0 and a),
            self.engine.slot_loads,
        )
        hook = self._signal_after
        if hook is not None and hook.due(self.writer.written):
            self._signal_after = None
            hook.fire()

    def _on_result(self, res) -> None:
        with self._lock:
            entry = self._inflight.pop(res.key, None)
            if entry is None:
                raise EngineError(f"internal: the engine returned an unknown or repeated request key {res.key}")
            spec, adapter = entry
            self._active[adapter] -= 1
        if res.error is not None:
            # the engine names the request by id ("request long: prompt has ..."); the line number does that here
            msg = res.error.one_line().removeprefix(f"request {res.id}: ")
            self._emit_error(spec, res.error.code, f"line {spec.lineno}: {msg}", adapter)
            return
        if res.score is not None:  # a scoring line (simple format only)
            sc = res.score
            record = self._fmt.score_record(spec, sc.logprob, sc.is_greedy, sc.token_logprobs)
        else:
            # n > 1: every sample's choice, in index order (one record per line, completion tokens summed)
            choices = [(s.text, s.finish_reason) for s in res.samples] if len(res.samples) > 1 else None
            record = self._fmt.ok_record(
                spec,
                res.text,
                res.finish_reason,
                res.prompt_tokens,
                res.completion_tokens,
                choices,
                logprobs=line_logprobs(res),
            )
        with self._lock:
            self.stats.add_ok(adapter, res.prompt_tokens, res.completion_tokens)
            self.writer.put(spec.key, record, tag=self._tag(spec.key))
            self._wrote()

    # -- the job --------------------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        t0 = time.perf_counter()
        source, in_name = open_input(cfg.input)
        reader = outputs = None
        try:
            refuse_clobbering(source, in_name, {"-o": cfg.output, "--errors": cfg.errors, "--stats": cfg.stats})
            check_ledger_clash(cfg)
            if cfg.engine.device != "cpu":
                # the CUDA context and Triton's CUDA driver (cold: a C compile) are made on a thread while the
                # pre-flight, the input's facts and the engine's imports run (torch first: pre-flight imports it)
                import torch  # noqa: F401

                from multilora_cli.kernels import driver_warm

                driver_warm.start()
            self._pf = pf = preflight_run(cfg)
            self._good = {n: Path(p) for n, p in pf.adapters.items() if n not in pf.errors}
            self._base_names = base_aliases([cfg.model, pf.model], Path(pf.model_path), [*pf.adapters, *pf.errors])
            # the input's line kinds and prompt tokens: what the engine precompiles (run/line_kinds.py)
            facts = read_input_facts(
                cfg.input, str(pf.model_path), cfg.sampling, self._good, self._base_names, pf.errors
            )
            engine_cfg, self._slots = engine_config(
                cfg, pf, self._good, *((facts.kinds, facts.prompt_tokens) if facts is not None else ())
            )
            if cfg.output not in (None, "-"):
                self._ledger = RunLedger(cfg, engine_cfg, Path(pf.model_path), self._good, pf.errors, self._base_names)
            if cfg.input == "-" and sys.stdin.isatty():  # `multilora run -` typed alone waits here, silently
                note("reading requests from the terminal (stdin): one JSON object per line, Ctrl-D to end", cfg.quiet)
            reader = InputReader(source, in_name)
            self._fmt = reader.format
            specs = unique_ids(self._parse(reader), self._seen)
            outputs = RunOutputs(cfg, self._ledger)
            resume = outputs.check(specs, reader.format)
            self.stats.resumed, self.stats.kept_errors = resume.kept, resume.kept_errors
            first = next(specs, None)
            self.progress = make_progress(cfg.quiet)
            if first is not None:  # the engine starts before -o is opened: failing to start must not empty it
                self.engine = self._engine_factory(
                    EnginePlan(
                        config=engine_cfg,
                        adapters=self._good,
                        base_names=frozenset(self._base_names),
                        scans=pf.scans,
                        input=cfg.input,
                        resumed=resume.kept,
                        sampling=cfg.sampling,
                        tokenizer=facts.tokenizer if facts is not None else None,
                    )
                )
            self.writer = outputs.open()
            self._ledger, self._resumable = outputs.ledger, outputs.resumable
            if first is None:
                if reader.empty and not resume.kept:  # (the reader drains its head while --resume verifies)
                    note(f"no requests in {in_name} (empty input): nothing to do")
                else:
                    note(f"nothing left to run: all {resume.kept} records are already in {cfg.output}", cfg.quiet)
                return self._finish(t0, in_name, None)
            return self._generate(itertools.chain([first], specs), t0, in_name)
        finally:
            if reader is not None:
                reader.close()
            elif source is not getattr(sys.stdin, "buffer", None):
                source.close()
            if outputs is not None:
                outputs.close()
            if hasattr(self, "writer"):
                self.writer.close()

    def _generate(self, specs: Iterator[LineSpec], t0: float, in_name: str) -> int:
        cfg = self.cfg
        self._resolver = SamplingResolver(self.engine.default_sampling, cfg.sampling)
        total = None if cfg.quiet else count_records(cfg.input)
        self.progress.start(None if total is None else max(total - self.stats.resumed, 0))
        try:
            for res in self.engine.generate(self._requests(specs)):
                self._on_result(res)
            if self._inflight or self.writer.pending:
                lines = sorted(s.lineno for s, _ in self._inflight.values())[:5]
                raise EngineError(
                    f"internal: the engine finished without results for {len(self._inflight)} "
                    f"requests (input lines {lines})"
                )
        except BaseException as exc:  # fatal error, bug or Ctrl-C: the output is a valid prefix; say how to go on
            if isinstance(exc, KeyboardInterrupt):
                stop_on_next_signal(force=self._local)
            self.progress.close()
            if self._resumable:  # -o /dev/stdout or a FIFO: nothing to --resume
                done = self.stats.resumed + self.writer.written
                note(
                    f"stopped after {done} record{'' if done == 1 else 's'} in {cfg.output}; "
                    "rerun the same command with --resume to finish"
                )
            raise
        self.progress.close()
        return self._finish(t0, in_name, self.engine.stats.to_dict())

    def _finish(self, t0: float, in_name: str, engine_stats: dict | None) -> int:
        cfg = self.cfg
        info = {} if engine_stats is not None else {"model": str(self._pf.model_path)}  # no engine was needed
        stats = self.stats.to_dict(
            engine=engine_stats,
            wall_seconds=time.perf_counter() - t0,
            gpu_hour_usd=cfg.gpu_hour_usd,
            input=in_name,
            output=cfg.output or "<stdout>",
            format=self._fmt.name,
            **info,
        )
        stats["slots"] = self._slots.to_dict()  # the slot count and why (engine/slot_budget.py)
        if engine_stats is not None:
            self.engine.annotate_stats(stats)  # e.g. a data-parallel run's per-worker section
        if cfg.stats:
            write_stats(cfg.stats, stats)
        if not cfg.quiet and engine_stats is not None:
            print_summary(stats)
            self.engine.print_summary(stats)
        return EXIT_PARTIAL if self.stats.errors or self.stats.kept_errors else EXIT_OK
