"""Typer app: registers the commands and maps the error family to messages and exit codes.

Command modules keep heavy imports (torch, triton) inside their functions so `--help` stays fast.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import typer

from multilora_cli import __version__
from multilora_cli.commands import bench, demo, economics, inspect, run
from multilora_cli.errors import EXIT_FATAL, MultiloraError

app = typer.Typer(
    name="multilora",
    help="Offline batch LLM inference over many LoRA adapters on one shared base model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: at 80 columns rich's panels cut long flag names (--gpu-memory-utiliz…) and help text,
    # and showed a stray <bool> beside -h
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"multilora {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", metavar="", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Offline batch LLM inference over many LoRA adapters on one shared base model."""


app.command("run")(run.command)
app.command("inspect")(inspect.command)
app.command("economics")(economics.command)
app.command("demo")(demo.command)
app.command("bench")(bench.command)


def debug_enabled() -> bool:
    return os.environ.get("MULTILORA_DEBUG", "") not in ("", "0", "false", "no")


EXIT_SIGTERM = 143  # 128 + SIGTERM, what a shell reports for a process the signal ended
_terminated = False  # set by the SIGTERM handler: typer turns the exception into a plain abort / Exit(130)


def _on_sigterm(signum, frame) -> None:
    # `kill`, Slurm or Kubernetes ask the job to stop: end it like Ctrl-C (in-flight lines are dropped, the output
    # stays a valid prefix, `run` says how to --resume) instead of dying without a word.
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def _catch_sigterm() -> None:
    """Route SIGTERM through _on_sigterm, unless someone (torchrun, a test harness) already handles it."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def report(exc: BaseException) -> int:
    """Print `exc` for a user and return the exit code. The only place errors become messages."""
    if isinstance(exc, MultiloraError):
        if debug_enabled():
            import traceback

            traceback.print_exception(exc)
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        if _terminated:
            print("error: terminated (SIGTERM)", file=sys.stderr)
            return EXIT_SIGTERM
        print("error: interrupted", file=sys.stderr)
        return 130
    if debug_enabled():
        import traceback

        traceback.print_exception(exc)
        print(f"error: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        print(
            f"error: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug; rerun with MULTILORA_DEBUG=1 for the traceback and report it)",
            file=sys.stderr,
        )
    return EXIT_FATAL


def _click_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    # typer >= 0.25 vendors click as typer._click; older typer uses click itself. Accept both.
    import importlib

    mods = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    errors = tuple(m.ClickException for m in mods if hasattr(m, "ClickException"))
    aborts = tuple(m.Abort for m in mods if hasattr(m, "Abort"))
    return errors, aborts


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Commands return an exit code (0 or 3) or raise a MultiloraError."""
    click_errors, aborts = _click_types()
    _catch_sigterm()
    try:
        rc = app(args=argv, standalone_mode=False)
    except aborts:
        sys.exit(report(KeyboardInterrupt()))
    except click_errors as e:  # bad flags: click's own usage message, exit 2
        e.show()
        sys.exit(e.exit_code)
    except BaseException as e:  # noqa: BLE001 - the one place that maps everything
        if isinstance(e, SystemExit):
            raise
        sys.exit(report(e))
    if rc == 130:  # typer turns Ctrl-C inside a command into a silent Exit(130); say what happened
        sys.exit(report(KeyboardInterrupt()))
    rc = rc if isinstance(rc, int) else 0
    # the console entry point of a run, not under a profiler or tracer (their reports are written at exit)
    if argv is None and sys.argv[1:2] == ["run"] and sys.getprofile() is None and sys.gettrace() is None:
        _end_process(rc)
    sys.exit(rc)


def _end_process(rc: int) -> None:
    """End the process with exit code `rc` after a command returned, doing what the interpreter's shutdown does
    that anyone can see (join non-daemon threads, run the atexit hooks: multiprocessing joins its children,
    logging flushes; flush stdout and stderr) and skipping what nobody can: tearing down every module and
    collecting the objects of torch, Triton and the engine, which the OS frees at once. The demo's run on CPU
    (a shared 2-core host): 0.7-1.7 s from sys.exit to the process's end, 0.11 s so. A run's own files (records,
    errors, stats, the --resume ledger) are closed before it returns (io/writer.py, run/outputs.py, io/stats.py;
    tests/run/test_run_exit.py); a stream that cannot be flushed (a reader that went away) takes the usual way
    out, which reports it. Only `run`: other commands have not been checked for files left open. (gc.freeze
    instead kept Triton's nanobind objects alive to the end: ~30 lines of leak warnings at every exit.)"""
    import atexit

    shutdown = getattr(threading, "_shutdown", None)  # what Py_Finalize calls first
    if shutdown is None or not _flushed():
        sys.exit(rc)
    shutdown()
    atexit._run_exitfuncs()
    if not _flushed():  # (an atexit hook wrote to a stream that is gone)
        sys.exit(rc)
    os._exit(rc)


def _flushed() -> bool:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                return False
    return True
