"""MoE bases (Mixtral, Qwen2-MoE, Qwen3-MoE) with LoRA on attention and experts, served by the engine on CPU fp32:
one mixed batch (base rows, attention-only, expert-only, both; PEFT target_parameters and hand-written per-expert
module adapters) gives each row HF transformers + PEFT's greedy tokens; logits to 1e-4; batch invariance; slot
eviction; the router refused as a LoRA target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multilora_cli.adapters.scan import scan_adapter
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.errors import UnsupportedAdapterError
from tests.builders import hf_model, load_peft
from tests.models.moe_builders import (
    MOE_ARCHS,
    build_module_adapter,
    build_moe_base,
    build_param_adapter,
    merged_module_adapter,
)

NEW = 5
ATTN = ("q_proj", "v_proj")
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _adapters(root: Path, base: Path) -> dict[str, Path]:
    return {
        "attn": build_param_adapter(base, root / "attn", targets=ATTN, r=4, seed=11),
        "experts": build_param_adapter(base, root / "experts", params=EXPERTS, r=4, alpha=16, seed=12),
        "both": build_param_adapter(base, root / "both", targets=("o_proj",), params=EXPERTS, r=2, seed=13),
        # every linear module PEFT finds (Qwen2-MoE: its shared expert and the dense layer's MLP too) + experts
        "all": build_param_adapter(base, root / "all", targets=ALL_LINEAR, params=EXPERTS, r=4, seed=14),
    }


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 256, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _requests(prompts, plan):
    sp = SamplingParams(max_tokens=NEW, ignore_eos=True)
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=sp)
        for i, (p, a) in enumerate(zip(prompts, plan))
    ]


def _greedy(model, prompt) -> tuple[list[int], list[float]]:
    ids, lps = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(input_ids=ids).logits[:, -1].float()
            tok = logits.argmax(-1, keepdim=True)
            lps.append(float(torch.log_softmax(logits, -1)[0, tok]))
            ids = torch.cat([ids, tok], dim=1)
    return ids[0, len(prompt) :].tolist(), lps


def _references(base: Path, adapters: dict[str, Path]) -> dict:
    """{adapter or None: the HF model giving that row's reference}: the base, and one PeftModel per adapter (PEFT
    refuses adapters with different target_parameters in one model: the "all" one's are converted from
    target_modules). PEFT loads the per-expert-module adapter too, converting it onto transformers 5's 3D experts
    (peft/utils/transformers_weight_conversion.py: gate and up LoRA as one block-diagonal gate_up_proj LoRA)."""
    refs = {None: hf_model(base)}
    qwen2 = json.loads((Path(base) / "config.json").read_text())["model_type"] == "qwen2_moe"
    for name, path in adapters.items():
        if name == "module" and qwen2:  # PEFT drops these expert tensors on Qwen2-MoE (moe_builders)
            refs[name] = merged_module_adapter(base, path, "qwen2_moe")
        else:
            refs[name] = load_peft(base, {name: path})
    return refs


def _hf(base: Path, adapters: dict[str, Path], prompts, plan):
    refs = _references(base, adapters)
    return [_greedy(refs[a], p) for p, a in zip(prompts, plan)]


def _engine(base, adapters, **kw):
    return Engine(
        EngineConfig(model=str(base), device="cpu", max_loras=kw.pop("max_loras", 4), max_lora_rank=8, **kw), adapters
    )


def _check(got, want):
    assert [r.error for r in got] == [None] * len(want)
    assert [r.token_ids for r in got] == [w[0] for w in want]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_mixed_batch_matches_hf_peft(tmp_path, arch):
    base = build_moe_base(tmp_path / "base", arch)
    adapters = _adapters(tmp_path, base)
    adapters["module"] = build_module_adapter(base, tmp_path / "module", arch)
    plan = ["experts", None, "attn", "both", "module", "experts", None, "all", "both", "module", "attn", "all"]
    prompts = _prompts(len(plan))
    engine = _engine(base, adapters, max_loras=5)
    got = engine.generate_all(_requests(prompts, plan))
    want = _hf(base, adapters, prompts, plan)
    _check(got, want)
    # expert LoRA matters: an expert-only row differs from the base on the same prompt
    base_rows = engine.generate_all(_requests(prompts, [None] * len(plan)))
    assert any(b.token_ids != g.token_ids for b, g, a in zip(base_rows, got, plan) if a in ("experts", "module"))
    # batch invariance: each row alone gives what it gave in the mixed batch
    for i in (0, 3, 4):
        alone = engine.generate_all(_requests([prompts[i]], [plan[i]]))
        assert alone[0].token_ids == got[i].token_ids


def test_slot_eviction(tmp_path):
    """max_loras 2 < 4 adapters: slots are evicted and reloaded, every row still exact."""
    arch = "qwen3_moe"
    base = build_moe_base(tmp_path / "base", arch)
    adapters = _adapters(tmp_path, base)
    adapters["module"] = build_module_adapter(base, tmp_path / "module", arch)
    plan = ["experts", "attn", "both", "module", "experts", "module", "attn", "both"]
    prompts = _prompts(len(plan), seed=3)
    engine = _engine(base, adapters, max_loras=2, max_num_seqs=2)
    got = engine.generate_all(_requests(prompts, plan))
    _check(got, _hf(base, adapters, prompts, plan))
    assert engine.slots.evictions > 0


def test_fused_checkpoint_layout_loads_the_same(tmp_path):
    """A checkpoint holding transformers 5's fused mlp.experts.gate_up_proj / down_proj gives the same tokens."""
    from safetensors.torch import load_file, save_file

    from multilora_cli.models.moe_names import expert_target

    base = build_moe_base(tmp_path / "base", "mixtral")
    fused = tmp_path / "fused"
    fused.mkdir()
    for f in base.iterdir():
        if f.name != "model.safetensors":
            (fused / f.name).write_bytes(f.read_bytes())
    t = load_file(str(base / "model.safetensors"))
    out, stacks = {}, {}
    for name, v in t.items():
        hit = expert_target(name)
        if hit is None:
            out[name.replace(".block_sparse_moe.", ".mlp.")] = v
        else:
            stacks.setdefault(hit[0], {})[hit[1:]] = v
    for pname, parts in stacks.items():
        E = 1 + max(e for e, _ in parts)
        if pname.endswith("gate_up_proj"):
            out[pname] = torch.stack([torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(E)])
        else:
            out[pname] = torch.stack([parts[(e, "down")] for e in range(E)])
    save_file(out, str(fused / "model.safetensors"))
    prompts = _prompts(3)
    a = _engine(base, {}).generate_all(_requests(prompts, [None] * 3))
    b = _engine(fused, {}).generate_all(_requests(prompts, [None] * 3))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


def test_router_lora_is_refused(tmp_path):
    """PEFT turns target_modules=["gate"] on the router into target_parameters ["gate.weight"]; an older stack's
    router LoRA is a module key (mlp.gate.lora_A). Both are refused, naming the router."""
    from safetensors.torch import save_file

    base = build_moe_base(tmp_path / "base", "mixtral")
    ad = build_param_adapter(base, tmp_path / "router", targets=("gate",), r=2)
    assert json.loads((ad / "adapter_config.json").read_text())["target_parameters"] == ["gate.weight"]
    with pytest.raises(UnsupportedAdapterError, match=r"MoE router \(gate\.weight\)"):
        scan_adapter(ad, "router")
    old = build_module_adapter(base, tmp_path / "old", "mixtral")
    pre = "base_model.model.model.layers.1.block_sparse_moe.gate"
    save_file(
        {f"{pre}.lora_A.weight": torch.zeros(2, 64), f"{pre}.lora_B.weight": torch.zeros(6, 2)},
        str(old / "adapter_model.safetensors"),
    )
    with pytest.raises(UnsupportedAdapterError, match=r"MoE router \(model\.layers\.1\.block_sparse_moe\.gate\)"):
        scan_adapter(old, "old")


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_block_output_within_1e4_of_hf_peft(tmp_path, arch):
    """One sparse block, tokens of three adapters and the base mixed: our output equals HF + PEFT's block (the
    adapter merged into the 3D expert weights by ParamWrapper) to 1e-4."""
    from multilora_cli.adapters.peft import load_adapter
    from multilora_cli.kernels import build_lora_meta
    from multilora_cli.layers.context import reset_context, set_context
    from multilora_cli.models.config import ModelConfig
    from multilora_cli.models.loader import load_model

    base = build_moe_base(tmp_path / "base", arch)
    adapters = _adapters(tmp_path, base)
    cfg = ModelConfig.from_dir(base)
    ours = load_model(base, cfg, dtype=torch.float32, max_loras=4, max_lora_rank=8).model.layers[0].mlp
    for slot, name in enumerate(adapters):
        a = load_adapter(adapters[name], name, cfg)
        ours.experts.lora.set_slot(slot, {p: a.experts[(0, p)] for p in ("gate", "up", "down") if (0, p) in a.experts})
    pm = load_peft(base, adapters)
    x = torch.randn(12, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    slots = [-1, 0, 1, 2] * 3
    want = torch.empty_like(x)
    with torch.no_grad():
        for t, s in enumerate(slots):
            block = pm.base_model.model.model.layers[0].mlp
            if s < 0:
                with pm.disable_adapter():
                    want[t] = block(x[t : t + 1][None])[0, 0]
            else:
                pm.set_adapter(list(adapters)[s])
                want[t] = block(x[t : t + 1][None])[0, 0]
        set_context(_ctx_with(build_lora_meta(slots)))
        try:
            got = ours(x)
        finally:
            reset_context()
    assert (got - want).abs().max() < 1e-4
    assert (want[1::4] - want[0::4]).abs().max() > 1e-3  # the expert adapter changes the block


def _ctx_with(meta):
    """A minimal step context carrying only LoRA metadata (the block reads nothing else)."""

    class _Ctx:
        lora = meta

    return _Ctx()


def test_run_cli_end_to_end(tmp_path):
    """`multilora run` on a tiny Qwen3-MoE base with an expert adapter: one record per line, in order."""
    from tests.run.helpers import read_jsonl, run_cli

    base = build_moe_base(tmp_path / "base", "qwen3_moe")
    ad = build_param_adapter(base, tmp_path / "both", targets=ATTN, params=EXPERTS, r=4)
    only = build_param_adapter(base, tmp_path / "exp", params=EXPERTS, r=8, seed=5)
    inp = tmp_path / "in.jsonl"
    plan = ["both", None, "exp", "both", "exp"]
    lines = [{"id": i, "prompt": "a b c", "max_tokens": 3, "adapter": a} for i, a in enumerate(plan)]
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["run", str(inp), "-m", str(base), "-a", f"both={ad}", "-a", f"exp={only}", "--device", "cpu", "-q"]
    rc, out, err = run_cli(args + ["--max-lora-rank", "8"])
    assert rc == 0, err
    recs = read_jsonl(out)
    assert [r["id"] for r in recs] == list(range(5)) and all("error" not in r for r in recs)
    assert recs[0]["text"] == recs[3]["text"] and recs[2]["text"] == recs[4]["text"]
    # --max-lora-rank below the expert-only adapter's rank: its lines get error records, the others are served
    rc, out, err = run_cli(args + ["--max-lora-rank", "4"])
    recs = read_jsonl(out)
    assert "adapter 'exp' failed pre-flight" in err and "has rank 8, above --max-lora-rank 4" in err
    assert [("error" in r) for r in recs] == [False, False, True, False, True]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_sizes_count_every_expert(tmp_path, arch):
    """num_params equals transformers' parameter count; slot_bytes equals the slot tensors the model allocates
    (attention + dense MLP LoRA, and E experts x rank on the sparse layers)."""
    from multilora_cli.engine.slot_budget import slot_bytes
    from multilora_cli.models.config import ModelConfig
    from multilora_cli.models.loader import load_model
    from tests.builders import hf_model

    base = build_moe_base(tmp_path / "base", arch)
    cfg = ModelConfig.from_dir(base)
    assert cfg.num_params() == sum(p.numel() for p in hf_model(base).parameters())
    m = load_model(base, cfg, dtype=torch.float32, max_loras=1, max_lora_rank=8)
    held = sum(t.numel() for mod in m.lora_modules().values() for t in (mod.lora.a, mod.lora.b))
    experts = [mod.lora for mod in m.expert_lora_modules().values()]
    held += sum(t.numel() for w in experts for t in (w.gu_a, w.gu_b, w.dn_a, w.dn_b))
    assert len(experts) == len(cfg.moe.sparse_layers) and slot_bytes(cfg, 8, 4) == 4 * held


def test_inspect_shows_expert_lora(tmp_path):
    """`inspect` lists the expert LoRA per part with its params over all experts, and counts it in the totals."""
    from multilora_cli.adapters.report import build_report

    base = build_moe_base(tmp_path / "base", "qwen3_moe")
    ad = build_param_adapter(base, tmp_path / "ad", targets=("q_proj",), params=EXPERTS, r=4)
    rep = build_report(str(ad), str(base))
    rows = {r.module: r for r in rep.modules}
    assert rep.servable and set(rows) == {"q_proj", "experts.gate", "experts.up", "experts.down"}
    e, h, i = 6, 64, 48
    assert rows["experts.gate"].params == 2 * e * 4 * (h + i)  # 2 layers x E experts x r (in + out)
    assert rows["experts.down"].params == 2 * e * 4 * (i + h)
    assert rep.num_params == sum(r.params for r in rows.values())
    assert rep.modules_adapted == ["q_proj", "experts.down", "experts.gate", "experts.up"]


def test_dense_mlp_lora_on_a_sparse_layer_is_refused(tmp_path):
    """A dense gate_proj LoRA (an adapter of another base) would have no module on a sparse layer: refused."""
    from multilora_cli.errors import AdapterError
    from multilora_cli.models.config import ModelConfig

    base = build_moe_base(tmp_path / "base", "qwen2_moe")  # layer 1 dense, layer 0 sparse
    ad = build_param_adapter(base, tmp_path / "ad", targets=("gate_proj",), r=2)  # PEFT finds layer 1 + shared
    cfg = ModelConfig.from_dir(base)
    scan = scan_adapter(ad, "ad", cfg)  # the dense layer's gate_proj and layer 0's shared expert: served
    assert set(scan.modules) == {(0, "shared_expert.gate_proj"), (1, "gate_proj")}
    gate = build_param_adapter(base, tmp_path / "gate", targets=("shared_expert_gate",), r=2)
    with pytest.raises(
        UnsupportedAdapterError, match=r"shared expert gate \(model\.layers\.0\.mlp\.shared_expert_gate\)"
    ):
        scan_adapter(gate, "gate", cfg)
    from safetensors.torch import load_file, save_file

    t = {k.replace("layers.1.", "layers.0."): v for k, v in load_file(str(ad / "adapter_model.safetensors")).items()}
    save_file({k: v for k, v in t.items() if "shared" not in k}, str(ad / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match="layer 0 of the base is a sparse MoE layer"):
        scan_adapter(ad, "ad", cfg)


def test_expert_only_adapter_rank_and_preflight(tmp_path):
    """An adapter with expert LoRA only: its rank is the experts' (preflight compares it with --max-lora-rank), and a
    config whose r disagrees with the tensors is refused."""
    from multilora_cli.errors import AdapterError
    from multilora_cli.models.config import ModelConfig

    base = build_moe_base(tmp_path / "base", "mixtral")
    ad = build_param_adapter(base, tmp_path / "ad", params=EXPERTS, r=3)
    cfg = ModelConfig.from_dir(base)
    assert scan_adapter(ad, "ad", cfg).max_rank == 3
    raw = json.loads((ad / "adapter_config.json").read_text())
    (ad / "adapter_config.json").write_text(json.dumps({**raw, "r": 6}))
    with pytest.raises(AdapterError, match=r"has rank 3 per expert but adapter_config.json gives it r=6"):
        scan_adapter(ad, "ad", cfg)


def test_economics_counts_expert_lora(tmp_path):
    """`economics --adapter` sizes a MoE adapter with its experts: one row per part, layers x experts of them."""
    from multilora_cli.economics.sources import load_adapter_shape
    from multilora_cli.models.config import ModelConfig

    base = build_moe_base(tmp_path / "base", "qwen3_moe")
    ad = build_param_adapter(base, tmp_path / "ad", targets=("q_proj",), params=EXPERTS, r=4)
    shape = load_adapter_shape(ad, ModelConfig.from_dir(base))
    rows = {m.module: m for m in shape.modules}
    assert shape.targets == ["q_proj", "experts.down", "experts.gate", "experts.up"]
    assert rows["experts.gate"].layers == 2 * 6 and rows["experts.gate"].params == 2 * 6 * 4 * (64 + 48)
    assert shape.params == 2 * 4 * (64 + 128) + 3 * 2 * 6 * 4 * (64 + 48)


@pytest.mark.parametrize(
    "arch, extra",
    [
        ("qwen3_moe", dict(sliding_window=4, use_sliding_window=True)),
        ("qwen3_moe", dict(sliding_window=4, use_sliding_window=False)),  # transformers drops the window
        ("qwen2_moe", dict(sliding_window=4, use_sliding_window=True, max_window_layers=1)),  # layer 0 only
        ("mixtral", dict(sliding_window=4)),
    ],
)
def test_sliding_window_as_transformers_sets_it(tmp_path, arch, extra):
    """Prompts run past a 4-token window: greedy tokens equal HF's wherever transformers applies the window."""
    base = build_moe_base(tmp_path / "base", arch, **extra)
    prompts = _prompts(3, seed=7)
    got = _engine(base, {}).generate_all(_requests(prompts, [None] * 3))
    from tests.builders import hf_model

    hf = hf_model(base)
    assert [r.token_ids for r in got] == [_greedy(hf, p)[0] for p in prompts]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_mixed_batch_logits_within_1e4(tmp_path, arch):
    """The whole model, one packed prefill then a decode step, rows of every adapter kind and the base mixed in
    the same batch: every token's logits within 1e-4 of HF + PEFT's for that row alone."""
    from multilora_cli.adapters.peft import load_adapter
    from multilora_cli.kernels import build_lora_meta
    from multilora_cli.models.config import ModelConfig
    from multilora_cli.models.loader import load_model
    from tests.models.helpers import Blocks, run_decode, run_prefill

    base = build_moe_base(tmp_path / "base", arch)
    adapters = _adapters(tmp_path, base)
    adapters["module"] = build_module_adapter(base, tmp_path / "module", arch)
    cfg = ModelConfig.from_dir(base)
    model = load_model(base, cfg, dtype=torch.float32, max_loras=5, max_lora_rank=8)
    slot_of = {name: s for s, name in enumerate(adapters)}
    for name, s in slot_of.items():
        ad = load_adapter(adapters[name], name, cfg)
        for (layer, fused), mod in model.lora_modules().items():
            mod.lora.set_slot(s, ad.slices_for(layer, fused))
        for layer, mod in model.expert_lora_modules().items():
            mod.lora.set_slot(
                s, {p: ad.experts[(layer, p)] for p in ("gate", "up", "down") if (layer, p) in ad.experts}
            )
    plan = ["both", None, "experts", "module", "all", "attn", "experts", "all"]
    prompts = _prompts(len(plan), seed=9)
    refs = _references(base, adapters)

    def ref(name, seq):
        with torch.no_grad():
            return refs[name](input_ids=torch.tensor([seq])).logits[0]

    blocks = Blocks(64, 4)
    model.allocate_kv_cache(64, 4)
    slots = [-1 if a is None else slot_of[a] for a, p in zip(plan, prompts) for _ in p]
    with torch.no_grad():
        logits = run_prefill(model, blocks, {i: (p, 0) for i, p in enumerate(prompts)}, lora=build_lora_meta(slots))
    start, nxt = 0, []
    for a, p in zip(plan, prompts):
        want = ref(a, p)
        torch.testing.assert_close(logits[start : start + len(p)], want, atol=1e-4, rtol=0)
        nxt.append(int(want[-1].argmax()))
        start += len(p)
    feed = {i: (nxt[i], len(p)) for i, p in enumerate(prompts)}
    meta = build_lora_meta([-1 if a is None else slot_of[a] for a in plan])
    with torch.no_grad():
        logits = run_decode(model, blocks, feed, lora=meta)
    for i, (a, p) in enumerate(zip(plan, prompts)):
        torch.testing.assert_close(logits[i], ref(a, p + [nxt[i]])[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_hand_merged_module_adapter_is_peft(tmp_path, arch):
    """The hand merge of a per-expert-module adapter (the Qwen2-MoE reference) equals PEFT's own conversion of it
    onto transformers 5's experts where PEFT makes one."""
    base = build_moe_base(tmp_path / "base", arch)
    ad = build_module_adapter(base, tmp_path / "module", arch)
    ids = torch.tensor([_prompts(1, seed=2)[0]])
    with torch.no_grad():
        peft_logits = load_peft(base, {"m": ad})(input_ids=ids).logits
        merged = merged_module_adapter(base, ad, arch)(input_ids=ids).logits
        plain = hf_model(base)(input_ids=ids).logits
    assert (peft_logits - merged).abs().max() < 1e-5 and (peft_logits - plain).abs().max() > 1e-2
