"""benchmarks.bench_moe_load on CPU (smoke): every arm timed on real PEFT checkpoints of the adapter's size."""

from __future__ import annotations


def test_moe_load_bench_smoke():
    from benchmarks.bench_moe_load import main

    report = main(
        ["--device", "cpu", "--layers", "2", "--hidden", "64", "--inter", "32", "--experts", "8", "--loads", "1"]
        + ["--repeats", "1"]
    )
    assert set(report["arms"]) == {"packed", "parallel", "tensors"} and report["parallel_vs_packed_read"] > 0
    for arm in report["arms"].values():
        assert arm["read_ms"] > 0 and arm["load_ms"] >= arm["host_ms"] > 0
    # attention q, k, v, o (hidden 64: q 64, kv 32) and the experts, rank 16, fp32 on CPU
    attn = 16 * ((64 + 64) + 2 * (64 + 32) + (64 + 64))
    experts = 8 * 16 * ((64 + 2 * 32) + (32 + 64))
    assert report["adapter_bytes"] == 2 * 4 * (attn + experts) and report["expert_bytes"] == 2 * 4 * experts
