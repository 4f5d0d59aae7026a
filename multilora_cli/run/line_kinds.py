"""The LineKinds of a run's input (config.LineKind), read before the engine starts, so that its precompile
dry-runs the sampler, logprob and grammar-mask variants those lines can launch and no others.

A line's kind is what its resolved SamplingParams (the line's fields > the CLI flags > the model's
generation_config.json, as the run resolves them: io/sampling.py) ask of the kernels after the forward, and
whether it runs the base model. Lines that fail (bad JSON, an unknown adapter, bad sampling fields) run
nothing and add no kind. A file larger than io/reader.PROMPT_BOUND_BYTES, stdin and pipes give None (unknown):
the engine then dry-runs a default set, and a variant outside it compiles at its first step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from multilora_cli.config import LineKind
from multilora_cli.engine.generation_config import read_generation_config
from multilora_cli.io.reader import small_file_specs
from multilora_cli.io.sampling import SamplingFlags, SamplingResolver
from multilora_cli.run.lines import admit


def input_line_kinds(
    path: str,
    model_dir: str,
    flags: SamplingFlags | None,
    good: Collection[str],
    base_names: Collection[str],
    errors: Mapping,
) -> frozenset[LineKind] | None:
    """The distinct kinds of the lines of input `path` that run (None: unknown). `model_dir`: the base (its
    generation_config.json's defaults); `flags`: the run's sampling flags; `good` / `base_names` / `errors`: the
    adapters that passed pre-flight, the names of the base, why the others failed (run/lines.admit)."""
    specs = small_file_specs(path)
    if specs is None:
        return None
    resolver = SamplingResolver(read_generation_config(model_dir).sampling, flags)
    kinds = set()
    for spec in specs:
        adapter = admit(spec, good, base_names, errors)
        params = resolver.resolve(spec) if spec.error is None else None
        if params is not None:
            kinds.add(LineKind.of(params, base=adapter is None, scoring=spec.continuation is not None))
    return frozenset(kinds)
