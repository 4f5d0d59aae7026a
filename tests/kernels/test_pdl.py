"""PDL mode selection (host only): never on CPU or under the interpreter, env and override parsing."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import pdl


def test_prefetch_needs_launch():
    with pytest.raises(ValueError, match="prefetch needs launch"):
        pdl.PdlMode(launch=False, prefetch=True)


def test_launch_keywords_only_when_on():
    assert pdl.OFF.kwargs() == {}
    assert pdl.PdlMode(launch=True).kwargs() == {"launch_pdl": True}


@pytest.mark.parametrize("value", ["1", "true", "ON", "yes"])
def test_off_under_the_interpreter(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert pdl._interpreting()


def test_tile_axis_bound_is_a_clear_error():
    from multilora_cli.kernels import checks
    from multilora_cli.kernels.meta import build_lora_meta

    meta = build_lora_meta([0] * 40 + [1] * 40, "cpu")  # 3 + 3 tiles of 16 rows
    assert checks.tile_grid(meta, 16, 80, 4) == 6 == checks.tile_grid(meta, 16, 80, 4, max_tiles=6)
    with pytest.raises(ValueError, match=r"exceed the grid's tile axis \(5\)"):
        checks.tile_grid(meta, 16, 80, 4, max_tiles=5)


def test_off_on_cpu_even_when_forced():
    pdl.force(pdl.PdlMode(launch=True, prefetch=True))
    try:
        assert pdl.pdl_mode(torch.device("cpu"), 1) == pdl.OFF
    finally:
        pdl.force(None)


@pytest.mark.parametrize(
    "tokens,mode",
    [
        (1, pdl.PdlMode(True, True)),
        (64, pdl.PdlMode(True, True)),
        (65, pdl.PdlMode(True)),
        (1024, pdl.PdlMode(True)),
        (1025, pdl.OFF),
        (8192, pdl.OFF),
    ],
)
def test_table_by_token_count(tokens, mode):
    assert pdl.table_mode(tokens) == mode


@pytest.mark.gpu
@pytest.mark.parametrize(
    "env,tokens,mode",
    [("0", 1, pdl.OFF), ("", 1, pdl.PdlMode(True, True)), ("", 256, pdl.PdlMode(True)), ("", 4096, pdl.OFF)],
)
def test_env_and_table_on_hopper(monkeypatch, env, tokens, mode):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    monkeypatch.setenv("MULTILORA_PDL", env)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert pdl.pdl_mode(torch.device("cuda"), tokens) == mode
