"""Sampling precedence (line > flags > generation_config > greedy 256) and the stats JSON."""

from __future__ import annotations

import json

import pytest

from multilora_cli.errors import UsageError
from multilora_cli.io.line import LineSpec
from multilora_cli.io.sampling import SamplingFlags, SamplingResolver
from multilora_cli.io.stats import RunStats, cost, write_stats


def spec(key=0, **sampling):
    return LineSpec(key, key + 1, key + 1, sampling=sampling)


def test_precedence_line_over_flags_over_model_over_fallback():
    r = SamplingResolver({"temperature": 0.7, "top_p": 0.9, "max_tokens": 100}, SamplingFlags(max_tokens=50, top_k=5))
    p = r.resolve(spec(temperature=0.0, stop="END"))
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.stop) == (50, 0.0, 0.9, 5, ["END"])
    q = SamplingResolver().resolve(spec())
    assert (q.max_tokens, q.temperature, q.seed) == (256, 0.0, None)
    assert r.resolve(spec(seed=3, temperature=1)).seed == 3


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("max_tokens", "ten", "max_tokens must be an integer"),
        ("temperature", -1, "temperature must be a finite number >= 0"),
        ("temperature", float("inf"), "temperature must be a finite number >= 0"),  # JSON 1e999 parses to inf
        ("top_p", 2, "top_p must be a number in (0, 1]"),
        ("stop", 5, "stop must be"),
    ],
)
def test_bad_line_fields_become_line_errors(field, value, words):
    s = spec(**{field: value})
    assert SamplingResolver().resolve(s) is None
    assert s.error.code == "invalid_sampling" and words in s.error.message and "line 1" in s.error.message


def test_a_vanishing_temperature_is_greedy():
    # logits / 1e-40 overflows float32 and the softmax would be NaN: such temperatures mean argmax
    assert SamplingResolver().resolve(spec(temperature=1e-40)).temperature == 0.0
    assert SamplingResolver().resolve(spec(temperature=1e-40)).greedy
    assert SamplingResolver().resolve(spec(temperature=1e-4)).temperature == 1e-4


def test_bad_flags_are_usage_errors():
    with pytest.raises(UsageError, match="^--top-p must be a number in") as e:
        SamplingFlags(top_p=0)
    assert e.value.exit_code == 2


def test_stats_dict_per_adapter_and_cost(tmp_path):
    s = RunStats(resumed=2, kept_errors=1)
    s.add_ok("legal", 10, 20)
    s.add_ok(None, 5, 5)
    s.add_error("nope", "unknown_adapter")
    engine = {
        "model": "m",
        "device": "cpu",
        "dtype": "float32",
        "wall_seconds": 2.0,
        "slot_loads": 3,
        "slot_evictions": 1,
        "slot_hits": 4,
        "per_adapter": {"legal": {"slot_loads": 3}},
    }
    d = s.to_dict(engine=engine, wall_seconds=4.0, gpu_hour_usd=3.6, input="in", output="out", format="simple")
    assert (d["records"], d["requests"], d["ok"], d["errors"]) == (5, 3, 2, 1)
    assert d["error_codes"] == {"unknown_adapter": 1}
    assert d["total_tokens"] == 40 and d["tokens_per_second"] == 20.0 and d["completion_tokens_per_second"] == 12.5
    assert d["per_adapter"]["legal"] == {
        "requests": 1,
        "errors": 0,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "slot_loads": 3,
    }
    assert d["per_adapter"]["base"]["requests"] == 1 and d["per_adapter"]["nope"]["errors"] == 1
    assert d["cost"]["usd_total"] == pytest.approx(3.6 * 4 / 3600)
    assert d["cost"]["usd_per_1m_tokens"] == pytest.approx(3.6 * 4 / 3600 / 40 * 1e6)
    assert d["slot_loads"] == 3 and d["slot_evictions"] == 1 and d["engine"] is engine
    assert cost(None, 1, 1, 1) is None and cost(1.0, 10, 0, 0)["usd_per_1m_tokens"] is None
    write_stats(str(tmp_path / "s.json"), d)
    assert json.loads((tmp_path / "s.json").read_text())["records"] == 5


def test_plain_progress_lines_and_quiet():
    import io

    from multilora_cli.io.progress import PlainProgress, Progress, make_progress

    buf = io.StringIO()
    p = PlainProgress(buf, every=0.0)
    p.start(10)
    p.update(4, 1, 1000, 2, 3)
    p.close()
    line = buf.getvalue()
    assert line.startswith("multilora: 4/10 records, 1 errors") and "tok/s" in line and "3 adapter loads" in line
    assert type(make_progress(quiet=True)) is Progress  # --quiet: draws nothing
