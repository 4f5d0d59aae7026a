"""Facts about a run's input read before the engine starts: the LineKinds of its lines (config.LineKind), so
that the precompile dry-runs the sampler, logprob and grammar-mask variants those lines can launch and no
others, and (given the base's tokenizer) their exact prompt tokens, so that it dry-runs only the prefill sizes
their steps can reach.

A line's kind is what its resolved SamplingParams (the line's fields > the CLI flags > the model's
generation_config.json, as the run resolves them: io/sampling.py) ask of the kernels after the forward, and
whether it runs the base model. Lines that fail (bad JSON, an unknown adapter, bad sampling fields, a prompt the
tokenizer refuses) run nothing and add nothing. A file larger than io/reader.PROMPT_BOUND_BYTES, stdin and pipes
give nothing (unknown): the engine then dry-runs a default set, and a variant outside it compiles at its first
step. The demo's 14 lines: 171 prompt tokens, where the byte bound (io/reader.prompt_token_bound) said 858, so
its dry run covered prefill steps up to 1,024 tokens for steps of at most ~185.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from multilora_cli.config import LineKind
from multilora_cli.engine.generation_config import read_generation_config
from multilora_cli.engine.scoring import scoring_ids
from multilora_cli.engine.tokenizer import Tokenizer
from multilora_cli.errors import MultiloraError
from multilora_cli.io.reader import line_token_bound, small_file_specs
from multilora_cli.io.sampling import SamplingFlags, SamplingResolver
from multilora_cli.run.lines import admit, to_request


@dataclass(frozen=True, slots=True)
class InputFacts:
    """kinds: the distinct LineKinds of the lines that run; prompt_tokens: their prompt tokens (a scoring line's
    context + continuation), counted up to `enough` (then more than that), None without a tokenizer; tokenizer:
    the base's engine.tokenizer.Tokenizer that counted them (the engine takes it: loaded once)."""

    kinds: frozenset[LineKind]
    prompt_tokens: int | None = None
    tokenizer: object | None = None


def read_input_facts(
    path: str,
    model_dir: str,
    flags: SamplingFlags | None,
    good: Collection[str],
    base_names: Collection[str],
    errors: Mapping,
    count_tokens: bool = True,
    enough: int = 1 << 16,
) -> InputFacts | None:
    """The facts of input `path` (None: unknown). `model_dir`: the base (its generation_config.json's defaults,
    its tokenizer); `flags`: the run's sampling flags; `good` / `base_names` / `errors`: the adapters that passed
    pre-flight, the names of the base, why the others failed (run/lines.admit); `count_tokens`: load the
    tokenizer and count the prompt tokens (a tokenizer that fails to load counts nothing: the engine reports it)."""
    specs = small_file_specs(path)
    if specs is None:
        return None
    tokenizer = None
    if count_tokens:
        try:
            tokenizer = Tokenizer.from_dir(model_dir)
        except MultiloraError:
            pass
    resolver = SamplingResolver(read_generation_config(model_dir).sampling, flags)
    kinds, tokens = set(), 0
    for spec in specs:
        adapter = admit(spec, good, base_names, errors)
        params = resolver.resolve(spec) if spec.error is None else None
        if params is None:
            continue
        scoring = spec.continuation is not None
        if tokenizer is not None and tokens <= enough:
            bound = line_token_bound(spec)
            if tokens + bound > enough:  # counting ends past `enough`: the bound serves, and a huge prompt (a
                tokens += bound  # megabyte: seconds and GBs to encode) is left to the run's own length check
            else:
                req = to_request(spec, adapter, params)
                try:
                    tokens += len(scoring_ids(tokenizer, req)[0] if scoring else tokenizer.encode_request(req))
                except MultiloraError:  # an error record: runs nothing
                    continue
        kinds.add(LineKind.of(params, base=adapter is None, scoring=scoring))
    return InputFacts(frozenset(kinds), tokens if tokenizer is not None else None, tokenizer)
