"""read_packed (checkpoint file -> arena block) against pack_adapter(load_adapter(...)), on real PEFT checkpoints."""

import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.adapters.scan import scan_adapter
from multilora_cli.engine.direct_read import READ_CHUNK, _pieces, read_packed, read_spans
from multilora_cli.engine.packed import PackedAdapter, pack_adapter
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.errors import AdapterError
from multilora_cli.models.config import ModelConfig
from tests.builders import build_adapter, build_base

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("direct")
    base = build_base(root / "base")
    out = {
        "all": build_adapter(base, root / "all", r=8, alpha=16, targets=ALL),
        "qv": build_adapter(base, root / "qv", r=4, alpha=8, targets=("q_proj", "v_proj"), seed=2),
        "pattern": build_adapter(
            base,
            root / "pattern",
            r=8,
            alpha=16,
            targets=ALL,
            seed=3,
            rank_pattern={"k_proj": 4, "down_proj": 2},
            alpha_pattern={"o_proj": 3},
            use_rslora=True,
        ),
        "bin": build_adapter(base, root / "bin", r=4, targets=("q_proj",), seed=4, safetensors=False),
        "dora": build_adapter(
            base, root / "dora", r=4, alpha=8, targets=("q_proj", "v_proj", "up_proj"), seed=5, use_dora=True
        ),
    }
    for dt, tag in ((torch.bfloat16, "all_bf16"), (torch.float16, "all_fp16")):
        out[tag] = _recast(out["all"], root / tag, lambda k, t, dt=dt: t.to(dt))
    out["mixed"] = _recast(out["all"], root / "mixed", lambda k, t: t.half() if "lora_A" in k else t)
    return ModelConfig.from_dir(base), out


def _recast(src: Path, dst: Path, fn) -> Path:
    shutil.copytree(src, dst)
    f = dst / "adapter_model.safetensors"
    save_file({k: fn(k, t).contiguous() for k, t in load_file(f).items()}, f)
    return dst


def _arena(mb=64):
    return PinnedArena(mb << 20, cuda=False)


@pytest.mark.parametrize("tag", ["all", "qv", "pattern", "all_bf16", "all_fp16", "dora"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bit_identical_to_load_then_pack(ckpts, tag, dtype):
    cfg, paths = ckpts
    arena = _arena()
    got = read_packed(paths[tag], tag, cfg, dtype, arena)
    want = pack_adapter(load_adapter(paths[tag], tag, cfg, dtype=dtype), pin=False, dtype=dtype)
    assert isinstance(got, PackedAdapter) and got.block is not None and arena.allocs == 1
    assert got.flat.dtype == dtype and torch.equal(got.flat.view(torch.uint8), want.flat.view(torch.uint8))
    assert got.groups == want.groups and got.layout == want.layout
    assert (got.max_rank, got.min_rank, got.num_params) == (want.max_rank, want.min_rank, want.num_params)
    ref = load_adapter(paths[tag], tag, cfg)
    assert (got.max_rank, got.min_rank, got.num_params) == (ref.max_rank, ref.min_rank, ref.num_params)
    assert set(got.modules) == set(ref.modules) and len(got.modules) == len(ref.modules)
    for key, m in ref.modules.items():  # lazily made views: the adapter as load_adapter gives it
        pm = got.modules[key]
        assert torch.equal(pm.a, m.a.to(dtype)) and torch.equal(pm.b, m.b.to(dtype)) and pm.scaling == m.scaling
    assert (got.stored_dtype, got.stored_nbytes, got.module_names) == (
        ref.stored_dtype,
        ref.stored_nbytes,
        ref.module_names,
    )
    # DoRA: the magnitudes are in the block, behind A / B (one copy to the device), in float32 whatever the dtype
    assert set(got.magnitudes) == set(ref.magnitudes) and (tag == "dora") == bool(ref.magnitudes)
    for key, m in ref.magnitudes.items():
        assert torch.equal(got.magnitudes[key], m)
        assert got.flat.data_ptr() <= got.magnitudes[key].data_ptr() < got.flat.data_ptr() + got.flat.nbytes


def test_falls_back_where_it_does_not_apply(ckpts):
    cfg, paths = ckpts
    assert read_packed(paths["bin"], "bin", cfg, torch.float32, _arena()) is None  # .bin
    assert read_packed(paths["mixed"], "mixed", cfg, torch.float32, _arena()) is None  # fp16 A, fp32 B
    full = _arena(1)
    hog = full.alloc(full.nbytes)
    assert hog is not None and read_packed(paths["all"], "all", cfg, torch.float32, full) is None


def _poison(src: Path, dst: Path, part: str, index: tuple[int, ...], value: float) -> Path:
    """A copy of the checkpoint `src` whose first tensor (by name) with `part` in its name holds `value` at
    `index`."""
    bad = _recast(src, dst, lambda k, t: t)
    f = bad / "adapter_model.safetensors"
    sd = load_file(f)
    sd[next(k for k in sorted(sd) if part in k)][index] = value
    save_file(sd, f)
    return bad


def test_nan_named_like_load_adapter_and_block_returned(ckpts, tmp_path):
    cfg, paths = ckpts
    bad = _poison(paths["all"], tmp_path / "nan", "layers.1.mlp.up_proj.lora_B", (3, 1), float("inf"))
    with pytest.raises(AdapterError) as want:
        load_adapter(bad, "nan", cfg)
    arena = _arena()
    with pytest.raises(AdapterError) as got:
        read_packed(bad, "nan", cfg, torch.bfloat16, arena)
    assert got.value.message == want.value.message and "up_proj: lora_B contains NaN or Inf" in got.value.message
    arena.alloc(1)  # the failed read's block went back
    assert arena.free_bytes == arena.nbytes - 4096


def test_nonfinite_magnitude_named_like_load_adapter(ckpts, tmp_path):
    cfg, paths = ckpts
    bad = _poison(
        paths["dora"], tmp_path / "nan_m", "layers.1.self_attn.v_proj.lora_magnitude_vector", (2,), float("nan")
    )
    with pytest.raises(AdapterError) as want:
        load_adapter(bad, "nan_m", cfg)
    with pytest.raises(AdapterError) as got:
        read_packed(bad, "nan_m", cfg, torch.bfloat16, _arena())
    assert got.value.message == want.value.message and "v_proj" in got.value.message


def test_structural_errors_are_load_adapters(ckpts, tmp_path):
    cfg, paths = ckpts
    other = ModelConfig(
        **{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "hidden_size": cfg.hidden_size * 2}
    )
    for path, model in ((paths["all"], other), (tmp_path / "missing", cfg)):
        with pytest.raises(AdapterError) as want:
            load_adapter(path, "x", model)
        with pytest.raises(AdapterError) as got:
            read_packed(path, "x", model, torch.float32, _arena())
        assert got.value.message == want.value.message
    assert scan_adapter(paths["pattern"], "p", cfg).max_rank == 8


def test_read_spans_runs_gaps_and_short_files(tmp_path):
    rng = random.Random(0)
    data = os.urandom(300_000)
    f = tmp_path / "blob"
    f.write_bytes(data)
    # 2,500 pieces (more than one preadv's IOV_MAX), some skipped (gaps), written to shuffled places
    cuts = sorted(rng.sample(range(1, len(data)), 2499))
    pieces = [(b, e) for b, e in zip([0] + cuts, cuts + [len(data)]) if rng.random() > 0.1]
    order = list(range(len(pieces)))
    rng.shuffle(order)
    dst, spans, pos = {}, [], 0
    for i in order:
        b, e = pieces[i]
        spans.append((b, e, pos))
        dst[i] = pos
        pos += e - b
    scan = type("S", (), {"name": "blob"})()
    # one thread, then a pool of readers taking pieces of at most 7,001 bytes (spans split across pieces)
    with ThreadPoolExecutor(3) as readers:
        for pool, chunk in ((None, READ_CHUNK), (readers, 7_001), (readers, READ_CHUNK)):
            target = bytearray(pos)
            read_spans(f, memoryview(target), spans, scan, pool, chunk)
            for i, (b, e) in enumerate(pieces):
                assert target[dst[i] : dst[i] + e - b] == data[b:e]
        for pool in (None, readers):
            with pytest.raises(AdapterError, match="ended at byte"):
                read_spans(f, memoryview(bytearray(16)), [(len(data) - 8, len(data) + 8, 0)], scan, pool, 4)


def test_read_pieces_split_at_the_chunk_and_break_at_gaps():
    spans = [(0, 10, 100), (10, 25, 0), (30, 31, 50)]
    assert _pieces(spans, None) == [[(0, 10, 100), (10, 25, 0)], [(30, 31, 50)]]
    assert _pieces(spans, 8) == [
        [(0, 8, 100)],
        [(8, 10, 108), (10, 16, 0)],
        [(16, 24, 6)],
        [(24, 25, 14)],
        [(30, 31, 50)],
    ]
    # pieces cover every byte once, each at its destination
    got = sorted((b, e, d) for piece in _pieces(spans, 3) for b, e, d in piece)
    assert sum(e - b for b, e, _ in got) == 26 and all(e - b <= 3 for b, e, _ in got)


def test_a_read_plan_is_reused_until_the_file_changes(ckpts, tmp_path):
    from multilora_cli.engine.direct_read import plan_read

    cfg, paths = ckpts
    path = _recast(paths["all"], tmp_path / "edit", lambda k, t: t)
    rp = plan_read(path, "e", cfg, torch.bfloat16)
    assert rp is not None and rp.nbytes == rp.plan.total * 2
    assert plan_read(paths["bin"], "b", cfg, torch.float32) is None
    arena = _arena()
    first = read_packed(path, "e", cfg, torch.bfloat16, arena, planned=rp)
    want = pack_adapter(load_adapter(path, "e", cfg), pin=False, dtype=torch.bfloat16)
    assert torch.equal(first.flat, want.flat)
    # the plan's layout, made once at planning (not ~70 tuples per read kept by the host cache), is the packer's
    assert first.layout is rp.layout and first.layout == want.layout
    f = path / "adapter_model.safetensors"  # rewritten: new values, and a new rank 8 -> rank 4 layout
    sd = {k: (t[:4] if "lora_A" in k else t[:, :4]).mul(3).contiguous() for k, t in load_file(f).items()}
    save_file(sd, f)
    cfgj = path / "adapter_config.json"
    cfgj.write_text(cfgj.read_text().replace('"r": 8', '"r": 4'))
    again = read_packed(path, "e", cfg, torch.bfloat16, arena, planned=rp)  # the stale plan is not used
    want = pack_adapter(load_adapter(path, "e", cfg), pin=False, dtype=torch.bfloat16)
    assert again.max_rank == 4 and torch.equal(again.flat, want.flat) and again.layout == want.layout != rp.layout


def test_a_plan_from_preflights_scan_is_the_same_and_a_change_after_the_scan_is_caught(ckpts, tmp_path):
    from multilora_cli.engine.direct_read import plan_read

    cfg, paths = ckpts
    path = _recast(paths["pattern"], tmp_path / "pf", lambda k, t: t)
    scan = scan_adapter(path, "p", cfg)  # what pre-flight keeps (Preflight.scans)
    given, fresh = plan_read(path, "p", cfg, torch.float16, scan=scan), plan_read(path, "p", cfg, torch.float16)
    assert given.scan is scan and given.ident == fresh.ident is not None
    assert (given.plan, given.spans, given.stored) == (fresh.plan, fresh.spans, fresh.stored)
    # the file changes after the scan but before the plan: the plan carries the scan's identity, so the read
    # re-plans instead of reading the new file with the old spans
    f = path / "adapter_model.safetensors"
    save_file({k: t.mul(2).contiguous() for k, t in load_file(f).items()}, f)
    st = os.stat(f)  # same size: make the new mtime certain (file times tick coarser than this test runs)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    late = plan_read(path, "p", cfg, torch.float16, scan=scan)
    assert late.ident == scan.ident
    got = read_packed(path, "p", cfg, torch.float16, _arena(), planned=late)
    want = pack_adapter(load_adapter(path, "p", cfg), pin=False, dtype=torch.float16)
    assert torch.equal(got.flat, want.flat)


@pytest.fixture(scope="module")
def phi3_ckpts(tmp_path_factory):
    """Phi-3 adapters on the fused qkv_proj / gate_up_proj: every module, and one with a rank_pattern in bf16."""
    root = tmp_path_factory.mktemp("direct-phi3")
    base = build_base(root / "base", "phi3")
    out = {
        "all": build_adapter(base, root / "all", r=8, alpha=16, targets="all-linear"),
        "pattern": build_adapter(
            base, root / "pattern", r=8, targets=("qkv_proj", "gate_up_proj"), seed=3, rank_pattern={"gate_up_proj": 4}
        ),
    }
    out["pattern_bf16"] = _recast(out["pattern"], root / "pattern_bf16", lambda k, t: t.bfloat16())
    out["dora_bf16"] = _recast(
        build_adapter(base, root / "dora", r=4, targets=("qkv_proj", "gate_up_proj"), seed=4, use_dora=True),
        root / "dora_bf16",
        lambda k, t: t.bfloat16(),
    )
    return ModelConfig.from_dir(base), out


@pytest.mark.parametrize("tag", ["all", "pattern", "pattern_bf16", "dora_bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_checkpoint_modules_read_bit_identical(phi3_ckpts, tag, dtype):
    """A fused module's slices (its lora_A read once per slice, its lora_B rows as sub-spans) land as load_adapter
    + pack_adapter put them."""
    cfg, paths = phi3_ckpts
    got = read_packed(paths[tag], tag, cfg, dtype, _arena())
    want = pack_adapter(load_adapter(paths[tag], tag, cfg, dtype=dtype), pin=False, dtype=dtype)
    assert torch.equal(got.flat.view(torch.uint8), want.flat.view(torch.uint8)) and got.groups == want.groups
    assert {name for _, name in got.modules} >= {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    if tag.startswith("dora"):  # each slice's rows of the fused magnitude vector, read as sub-spans
        ref = load_adapter(paths[tag], tag, cfg)
        assert set(got.magnitudes) == set(ref.magnitudes) and len(ref.magnitudes) == 2 * 5
        assert all(torch.equal(got.magnitudes[k], m) for k, m in ref.magnitudes.items())
    assert all(g.uniform for (_, fused), g in got.groups.items() if fused in ("qkv_proj", "gate_up_proj"))


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_read_threads_is_validated(bad):
    from multilora_cli.config import EngineConfig
    from multilora_cli.errors import ConfigError

    assert EngineConfig(model="m").read_threads == 8
    with pytest.raises(ConfigError, match="read_threads must be an integer >= 1"):
        EngineConfig(model="m", read_threads=bad)


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_values_past_float16s_range_refused_when_served_in_float16(ckpts, tmp_path, stored):
    """A finite value that float16 cannot hold (1e5 > 65,504) would be served as Inf: both readers refuse the
    adapter in float16, naming the tensor and the dtype, and serve it in bfloat16 / float32 as stored."""
    cfg, paths = ckpts
    big = _poison(paths["all"], tmp_path / f"big_{stored}", "layers.0.self_attn.o_proj.lora_B", (2, 3), 1e5)
    big = _recast(big, tmp_path / f"big_{stored}_cast", lambda k, t: t.to(stored))
    with pytest.raises(AdapterError) as want:
        load_adapter(big, "big", cfg, dtype=torch.float16)
    with pytest.raises(AdapterError) as got:
        read_packed(big, "big", cfg, torch.float16, _arena())
    msg = got.value.message
    assert msg == want.value.message and "o_proj: lora_B holds values beyond float16's range (largest 65504)" in msg
    assert "--dtype bfloat16" in got.value.hint
    for dtype in (torch.bfloat16, torch.float32):
        packed = read_packed(big, "big", cfg, dtype, _arena())
        assert packed is not None and bool(torch.isfinite(packed.flat).all())
        load_adapter(big, "big", cfg, dtype=dtype)
