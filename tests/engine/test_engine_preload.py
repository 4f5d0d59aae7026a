"""Slot preloads through the engine on CPU (forced: the engine preloads on CUDA only): HF + PEFT's tokens, one load
per adapter, no eviction, and preloads that fire (issue 38); under slot pressure with run-ahead, the same tokens
with preloads on and off. The CUDA runs: test_engine_preload_gpu.py."""

from __future__ import annotations

from tests.engine.test_engine_preload_gpu import check_preload_stress, check_preloads


def test_forced_preloads_on_cpu_change_no_token(tmp_path):
    check_preloads(tmp_path, "cpu", 12)


def test_forced_preloads_under_slot_pressure_on_cpu_change_no_token(tmp_path):
    check_preload_stress(tmp_path, "cpu", 12, 5)
