"""The --resume ledger's side of a `multilora run` to `-o FILE` (io/ledger.py holds the format).

A run fingerprints what its records depend on besides their lines (the ledger header), and gives each input line
a ledger line: the hash of its raw bytes and the identity of the adapter it names. RunJob notes raw lines as the
reader yields them, marks each spec before admission, and hands the writer each record's ledger line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from multilora_cli.adapters.identity import ADAPTER_FILES
from multilora_cli.config import EngineConfig
from multilora_cli.errors import UsageError
from multilora_cli.io.ledger import (
    MODEL_FILES,
    Fingerprint,
    folder_fingerprint,
    ledger_path,
    line_hash,
    short_hash,
)
from multilora_cli.io.line import LineSpec
from multilora_cli.io.sampling import SamplingResolver
from multilora_cli.io.sink import names_a_descriptor
from multilora_cli.paths import expand_user
from multilora_cli.run.config import RunConfig


class RunLedger:
    """Ledger lines of one run. `good`: adapter name -> folder of those that passed pre-flight; `pf_errors`: the
    pre-flight failures; `base_names`: names that mean the base model."""

    def __init__(
        self,
        cfg: RunConfig,
        engine_cfg: EngineConfig,
        model_path: Path,
        good: dict[str, Path],
        pf_errors: dict,
        base_names: set[str],
    ):
        self._good, self._pf_errors, self._base_names = good, pf_errors, base_names
        self._line_hashes: dict[int, str] = {}  # key -> hash of the raw line, until its ledger line is made
        self._tags: dict[int, str] = {}  # key -> ledger line, until its record is written
        self._adapter_ids: dict[str | None, str] = {}
        self.fingerprint = Fingerprint(self._settings(cfg, engine_cfg, model_path), self.tag, self.adapter_now)

    @staticmethod
    def _settings(cfg: RunConfig, engine_cfg: EngineConfig, model_path: Path) -> dict:
        """What the records depend on besides their lines. Not the device, batch sizes or worker count: those do
        not change what a line asks for."""
        from multilora_cli.engine.generation_config import read_generation_config

        # the effective defaults, so `--max-tokens 16` where generation_config.json says 16 is the same run
        sampling = SamplingResolver(read_generation_config(model_path).sampling, cfg.sampling).base
        return {
            "model": folder_fingerprint(model_path, MODEL_FILES, ".safetensors"),
            "dtype": engine_cfg.dtype,
            "load_format": engine_cfg.load_format,
            "max_model_len": engine_cfg.max_model_len,
            "seed": engine_cfg.seed,
            "sampling": sampling,
            # only when on: ledgers written before the flag existed keep their fingerprint
            **({"quantization": engine_cfg.quantization} if engine_cfg.quantization != "none" else {}),
        }

    def note_line(self, key: int, raw: bytes) -> None:
        self._line_hashes[key] = line_hash(raw)

    def tag(self, spec: LineSpec) -> str:
        """The ledger line of `spec`: its raw line's hash and the identity of the adapter it names."""
        return f"{self._line_hashes.pop(spec.key)} {self._adapter_ident(spec.adapter)}"

    def mark(self, spec: LineSpec) -> None:
        """Make `spec`'s ledger line now (before admission: it must not depend on what admission marks failed)."""
        self._tags[spec.key] = self.tag(spec)

    def pop_tag(self, key: int) -> str | None:
        return self._tags.pop(key, None)

    def adapter_now(self, name: str | None) -> str:
        """What serves `name` in this run, in words: the ledger holds only a hash of what served it then, so a
        record refused for its adapter says what changed on this side (a dropped --adapters item is no file
        change)."""
        if name is None or name in self._base_names:
            return "this run takes that name for the base model"
        if name in self._good:
            return (
                f"it is {self._good[name]} now, whose files differ from those that wrote the record (or it "
                "was unknown or failed pre-flight then)"
            )
        if name in self._pf_errors:
            return f"in this run it fails pre-flight ({self._pf_errors[name].code}), unlike then"
        return "this run has no adapter of that name (was it dropped from --adapters / --adapter-dir?)"

    def _adapter_ident(self, name: str | None) -> str:
        """What serves `name`: the base, an adapter's files, or a pre-flight failure (its error records)."""
        ident = self._adapter_ids.get(name)
        if ident is None:
            if name is None or name in self._base_names:
                ident = short_hash(b"base")
            elif name in self._good:  # fingerprinted on first use: --adapter-dir may hold many never named
                ident = folder_fingerprint(self._good[name], ADAPTER_FILES)
            elif name in self._pf_errors:
                ident = short_hash(f"failed:{self._pf_errors[name].code}".encode())
            else:
                ident = short_hash(b"unknown")
            self._adapter_ids[name] = ident
        return ident


def check_ledger_clash(cfg: RunConfig) -> None:
    """Refuse (exit 2) another file of the run that is where -o keeps its ledger: one would overwrite the other."""
    if cfg.output in (None, "-"):
        return
    led = ledger_path(cfg.output).resolve()
    for flag, path in (("INPUT", cfg.input), ("--errors", cfg.errors), ("--stats", cfg.stats)):
        if path not in (None, "-") and expand_user(path).resolve() == led:
            raise UsageError(
                f"{flag} {path} is where -o {cfg.output} keeps its --resume ledger; give {flag} another path"
            )


def resumable_output(path: str | None, f) -> bool:
    """True when output `path`, open as `f`, is a regular file a later --resume can read back and keep a ledger
    beside: not stdout, /dev/null or a FIFO, nor /dev/stdout > FILE (a descriptor's name: no folder of its own)."""
    if path in (None, "-") or names_a_descriptor(path):
        return False
    try:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False
