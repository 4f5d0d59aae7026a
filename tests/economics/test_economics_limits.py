"""Flags and --stats values at the edges: inf / NaN / absurd sizes are one-line errors, never a crash or a NaN in
the JSON; the arithmetic stays sound where it degenerates (a zipf tail of zeros, shared needing more GPUs)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from multilora_cli.economics import lru_hit_rate, popularity
from multilora_cli.economics.units import usd


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tenants", 1_000_000_000], "--tenants must be at most 10,000,000"),  # used to exhaust memory
        (["--tenants", 5, "--gpu-memory-gb", "inf"], "--gpu-memory-gb must be a finite number, got inf"),
        (["--tenants", 5, "--gpu-memory-gb", "1e300"], "--gpu-memory-gb must be at most 100000"),
        (["--tenants", 5, "--gpu-bandwidth-tbs", "1e-300"], "--gpu-bandwidth-tbs must be >= 0.001"),
        (["--tenants", 5, "--gpu-bandwidth-tbs", "nan"], "--gpu-bandwidth-tbs must be a finite number"),
        (["--tenants", 5, "--gpu-hour-usd", "inf"], "--gpu-hour-usd must be a finite number"),
        (["--tenants", 5, "--gpu-hour-usd", -1], "--gpu-hour-usd must be >= 0"),
        (["--tenants", 5, "--pcie-gbs", 0], "--pcie-gbs must be >= 0.001"),
        (["--tenants", 5, "--tokens-per-tenant-per-s", "inf"], "--tokens-per-tenant-per-s must be a finite number"),
        (["--tenants", 5, "--tokens-per-tenant-per-s", "1e12"], "--tokens-per-tenant-per-s must be at most 1e+09"),
        (["--tenants", 5, "--output-tokens", 0.5], "--output-tokens must be >= 1"),
        (["--tenants", 5, "--requests-per-step", 0], "--requests-per-step must be > 0"),
        (["--tenants", 5, "--zipf-s", "inf"], "--zipf-s must be a finite number"),
        (["--tenants", 5, "--zipf-s", -1], "--zipf-s must be >= 0"),
    ],
)
def test_absurd_flags_are_usage_errors(cli, args, needle):
    rc, out, err = cli(*args)
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "body,needle",
    [
        (
            '{"completion_tokens_per_second": NaN}',
            "completion_tokens_per_second must be a non-negative number, got nan",
        ),
        ('{"completion_tokens_per_second": Infinity}', "completion_tokens_per_second must be a non-negative number"),
        (
            '{"completion_tokens_per_second": 100, "completion_tokens": 1e999}',
            "completion_tokens must be a non-negative",
        ),
        ('{"completion_tokens_per_second": 100, "requests": 2.5}', "requests must be a whole number, got 2.5"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ],
)
def test_stats_values_json_cannot_carry_are_refused(cli, tmp_path, body, needle):
    path = tmp_path / "run_stats.json"
    path.write_text(body)
    rc, out, err = cli("--tenants", 5, "--stats", path, "--json")
    assert rc == 1 and out == "", out[:200]
    assert err.startswith(f"error: --stats {path}: ") and needle in err and err.count("\n") == 1, err


def test_json_output_is_strict_json(cli, tmp_path):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    for args in ([], ["--popularity", "zipf", "--zipf-s", 100], ["--gpu-hour-usd", 0]):
        rc, out, _ = cli("--tenants", 50, *args, "--json")
        assert rc == 0
        json.loads(out, parse_constant=refuse)


def test_zipf_tail_that_underflows_to_zero_is_never_asked_for():
    p = popularity(3000, "zipf", 100.0)
    live = np.count_nonzero(p)
    assert live < 3000  # 2000**-100 underflows to 0: the premise of this test
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # used to loop to hi = inf and warn "invalid value encountered"
        assert lru_hit_rate(p, live) == 1.0
        assert 0.999 < lru_hit_rate(p, live - 100) <= 1.0  # T would pass 1e300: every request hits
        assert 0.999 < lru_hit_rate(p, 3) <= 1.0


def test_shared_needing_more_gpus_is_said_so(cli):
    # One tenant asking a copy's worth of tok/s: shared also reads its adapter each step, so it needs 2 GPUs
    rc, out, _ = cli("--tenants", 1, "--tokens-per-tenant-per-s", 3200, "--json")
    data = json.loads(out)
    assert data["fleet"]["gpus_saved"] == -1
    assert data["summary"].endswith("1 dedicated vs 2 shared h100-sxm GPUs, 1 more for shared = $2,183/month more")
    assert usd(-2182.7) == "-$2,183" and usd(-5) == "-$5.00" and usd(0) == "$0.00"


def test_more_replicas_than_tenants_is_one_tenant_per_replica(cli):
    # 10 tenants needing 5e9 tok/s of a replica at ~1e-3 tok/s: 5e12 replicas. ceil_div's absolute tolerance
    # rounded 10 / 5e12 tenants per replica down to 0, and the slot arithmetic divided by it (internal error).
    rc, out, err = cli("--tenants", 10, "--tokens-per-tenant-per-s", "1e9", "--bandwidth-efficiency", "1e-6", "--json")
    assert rc == 0, err
    assert json.loads(out)["slots"]["tenants_per_replica"] == 1


def test_ceil_div_never_rounds_a_positive_quotient_to_zero():
    from multilora_cli.economics.fleet import ceil_div

    assert ceil_div(10, 5e12) == 1 and ceil_div(8.000000001, 1) == 8 and ceil_div(0, 3) == 0 and ceil_div(9, 2) == 5
