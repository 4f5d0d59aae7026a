"""The `generation_config.json` defaults multilora does not apply yet, said once at start, never dropped silently.

A model's file may set generation defaults beyond those multilora applies (temperature, top_p, top_k, min_p,
max_new_tokens, min_new_tokens, repetition_penalty: engine/generation_config.py), e.g. `no_repeat_ngram_size`.
They are model-level defaults, not a line's request, so the run goes on without them
(refusing every line of a run for its model's file would be hostile), but a warning names the file and each field
(adapters/preflight.py adds it to the run's warnings). transformers' semantics decide what is a no-op: the
sampling-only ones (`min_p`, `typical_p`, ...) change nothing when `do_sample` is false or absent (greedy).
"""

from __future__ import annotations

import json
from pathlib import Path

from multilora_cli.json_values import is_no_op

FILE = "generation_config.json"

# field -> its no-op values (transformers' defaults); null always is one. Applied by transformers on any decoding:
ALWAYS: dict[str, tuple] = {
    "encoder_repetition_penalty": (1, 1.0),
    "no_repeat_ngram_size": (0,),
    "min_length": (0,),
    "bad_words_ids": ([],),
    "suppress_tokens": ([],),
    "begin_suppress_tokens": ([],),
    "sequence_bias": ({},),
    "forced_bos_token_id": (),
    "forced_eos_token_id": (),
    "exponential_decay_length_penalty": (),
    "num_beams": (1,),
    "num_return_sequences": (1,),
    "penalty_alpha": (0,),
    "guidance_scale": (1, 1.0),
}
# ... and only when do_sample is true
SAMPLING: dict[str, tuple] = {
    "typical_p": (1, 1.0),
    "epsilon_cutoff": (0,),
    "eta_cutoff": (0,),
}


def unapplied(gc: dict) -> list[str]:
    """'field=value' for each field of generation-config dict `gc` that would change generation and is not applied."""
    fields = {**ALWAYS, **(SAMPLING if gc.get("do_sample") is True else {})}
    return [f"{k}={json.dumps(gc[k])}" for k, neutral in fields.items() if k in gc and not is_no_op(gc[k], neutral)]


def unapplied_warning(model_dir: str | Path) -> str | None:
    """One line naming the model's generation_config.json and the fields not applied, or None. An unreadable file
    gives None here: reading it for the run raises its own error."""
    path = Path(model_dir) / FILE
    try:
        gc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    items = unapplied(gc) if isinstance(gc, dict) else []
    if not items:
        return None
    one = len(items) == 1
    return (
        f"{path}: {', '.join(items)} {'is' if one else 'are'} not applied (multilora does not serve "
        f"{'it' if one else 'them'} yet), so outputs differ from transformers' generate with this file; "
        f"the run goes on without {'it' if one else 'them'}"
    )
