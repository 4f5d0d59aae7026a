"""Read a model's `generation_config.json`: sampling defaults and its end-of-sequence ids.

Only fields the file sets become defaults (like vLLM), and they follow `transformers.generate` semantics:
`do_sample` false or absent means greedy (temperature / top_p / top_k / min_p are then ignored);
`max_new_tokens` maps to `max_tokens`, `min_new_tokens` to `min_tokens`; `repetition_penalty` applies to greedy
and sampled decoding alike. transformers' implicit top_k=50 is not applied (vLLM does not either): unset means off.
Precedence (the CLI contract): request fields > CLI flags > these defaults > greedy, 256 tokens.
Fields that would change generation but are not served (`no_repeat_ngram_size`, `min_length`, ...) are
not applied, and never silently: `not_applied` lists them, and `run` warns about them at start
(models/generation_unapplied.py, through adapters/preflight.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from multilora_cli.errors import ModelError
from multilora_cli.models.generation_unapplied import unapplied


def token_id_list(value) -> list[int]:
    """`eos_token_id` as HF writes it (int, list of ints, or null) -> list of ints."""
    if value is None:
        return []
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def read_json(path: Path) -> dict:
    """A JSON object from `path`, {} when the file is absent; a clear ModelError when it is unreadable."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: not valid JSON ({e})", hint="fix or remove the file") from e
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object")
    return data


@dataclass(slots=True)
class GenerationDefaults:
    """`sampling`: SamplingParams field -> default (only those the file sets); `eos_token_ids`: its eos ids;
    `not_applied`: 'field=value' of the fields the file sets that multilora does not apply."""

    sampling: dict = field(default_factory=dict)
    eos_token_ids: list[int] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)


def read_generation_config(model_dir: str | Path) -> GenerationDefaults:
    """Defaults from `model_dir/generation_config.json` (empty when the file is absent)."""
    gc = read_json(Path(model_dir) / "generation_config.json")
    out = GenerationDefaults(eos_token_ids=token_id_list(gc.get("eos_token_id")), not_applied=unapplied(gc))
    s = out.sampling
    mnt = gc.get("max_new_tokens")
    if _is_int(mnt) and mnt >= 1:
        s["max_tokens"] = mnt
    rp = gc.get("repetition_penalty")
    if _is_number(rp) and rp > 0:
        s["repetition_penalty"] = float(rp)
    mn = gc.get("min_new_tokens")
    if _is_int(mn) and mn >= 0:
        s["min_tokens"] = mn
    if "do_sample" not in gc and not any(k in gc for k in ("temperature", "top_p", "top_k")):
        return out
    if not gc.get("do_sample", False):
        s["temperature"] = 0.0  # transformers: no do_sample = greedy whatever the temperature says
        return out
    t = gc.get("temperature", 1.0)
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0:
        s["temperature"] = float(t)
    p = gc.get("top_p")
    if isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p <= 1:
        s["top_p"] = float(p)
    k = gc.get("top_k")
    if isinstance(k, int) and not isinstance(k, bool) and k >= 0:
        s["top_k"] = k
    mp = gc.get("min_p")
    if _is_number(mp) and 0 <= mp <= 1:
        s["min_p"] = float(mp)
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
