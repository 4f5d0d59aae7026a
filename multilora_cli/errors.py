"""The one error family users see.

Every user-facing failure is a `MultiloraError` (or subclass). `cli.main` maps it to a single line on
stderr and `exit_code`; anything else is a bug and gets a hint to rerun with MULTILORA_DEBUG=1.
Exit codes follow the CLI contract: 0 ok, 1 fatal, 2 usage, 3 finished with error records.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3


class MultiloraError(Exception):
    """Base of every error shown to users as one line. `hint` says what to do about it."""

    exit_code: int = EXIT_FATAL
    code: str = "error"  # machine-readable code used in error records

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return " ".join(text.split())


class UsageError(MultiloraError):
    """Bad flags or flag combinations."""

    exit_code = EXIT_USAGE
    code = "usage"


class ConfigError(MultiloraError):
    """A config dataclass rejected its values."""

    exit_code = EXIT_USAGE
    code = "invalid_config"


class ResolveError(MultiloraError):
    """A path or Hub id could not be resolved to files."""

    code = "not_found"


class AdapterError(MultiloraError):
    """An adapter is unreadable, invalid, or not servable."""

    code = "invalid_adapter"


class UnsupportedAdapterError(AdapterError):
    """An adapter uses a PEFT feature multilora cannot serve yet (DoRA, bias, ...)."""

    code = "unsupported_adapter"


class ModelError(MultiloraError):
    """The base model is unreadable or of an unsupported architecture."""

    code = "invalid_model"


class UnsupportedModelError(ModelError):
    """The base model is readable but of an architecture or a quantization multilora does not serve (yet)."""

    code = "unsupported_model"


class InputError(MultiloraError):
    """The input file as a whole is unreadable (per-line problems become error records instead)."""

    code = "invalid_input"


class RequestError(MultiloraError):
    """One input line is bad. Turned into an error record for that line; never fatal for the run."""

    code = "invalid_request"

    def __init__(self, message: str, *, code: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        if code:
            self.code = code


class OutputError(MultiloraError):
    """The output cannot be written, or a resume target does not match the input."""

    code = "output_error"


class EngineError(MultiloraError):
    """The engine cannot run with this configuration (e.g. out of memory for a single sequence)."""

    code = "engine_error"
