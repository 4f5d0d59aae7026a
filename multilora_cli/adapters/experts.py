"""Expert LoRA of MoE adapters: the two checkpoint layouts, read into per-(layer, part) stacks over the experts.

- PEFT `target_parameters` on transformers 5's 3D expert parameters (ParamWrapper; nested wrappers for a second
  parameter of the same module add `.base_layer`): `...layers.{i}.mlp.experts[.base_layer].lora_A.weight`
  [E * r, in] and `lora_B.weight` [out, r * E]. Expert e's factors are A.reshape(E, r, in)[e] and
  B.reshape(out, r, E)[:, :, e]; PEFT merges W_e += (alpha / r) * B_e A_e (gate_up_proj: in H, out 2I, gate rows
  first; down_proj: in I, out H; the shapes tell which parameter a pair is, since H = I and H = 2I cannot both hold).
- per-expert modules (older stacks): `...experts.{e}.w1|w3|w2` (Mixtral) or `gate_proj|up_proj|down_proj` (Qwen),
  `.lora_A.weight` [r, in] / `.lora_B.weight` [out, r]; experts a checkpoint leaves out are not adapted.
Either way the result is {(layer, "gate" | "up" | "down"): (A [E, r, in], B [E, out, r], scaling)}, which
`kernels/expert_weights.ExpertLoraWeights.set_slot` takes. The router (`gate`) and Qwen2-MoE's shared expert are
not served as LoRA targets: `expert_key` names them as unservable. Qwen2-MoE's shared expert is a dense MLP
whose projections are LoRA targets like a dense layer's (`shared_key`: modules "shared_expert.gate_proj", ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from multilora_cli.adapters.tensors import all_finite
from multilora_cli.errors import AdapterError

_PRE = r"^(?:base_model\.model\.)?(?P<module>(?:[A-Za-z0-9_.]*\.)?layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe)"
_SUF = r"\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$"
PARAM_KEY = re.compile(_PRE + r"\.experts)(?P<nest>(?:\.base_layer)*)" + _SUF)
MODULE_KEY = re.compile(_PRE + r"\.experts\.(?P<e>\d+)\.(?P<name>w1|w2|w3|gate_proj|up_proj|down_proj))" + _SUF)
ROUTER_KEY = re.compile(_PRE + r"\.(?:gate|shared_expert_gate))\.lora_")
SHARED_KEY = re.compile(_PRE + r"\.shared_expert\.(?P<name>gate_proj|up_proj|down_proj))" + _SUF)
PART = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
EXPERT_PARAMS = ("experts.gate_up_proj", "experts.down_proj")
PARTS = ("gate", "up", "down")


def shared_key(key: str) -> tuple[str, int, str, str] | None:
    """Qwen2-MoE's shared-expert LoRA key -> (module full name, layer, "shared_expert.<proj>", "A" | "B"), as
    tensors.classify_key gives a dense one; None otherwise."""
    m = SHARED_KEY.match(key)
    if m is None:
        return None
    return m.group("module"), int(m.group("layer")), f"shared_expert.{m.group('name')}", m.group("ab")


def expert_key(key: str) -> str | bool:
    """True for an expert-LoRA key; a reason string for a MoE module multilora does not adapt; False otherwise."""
    if PARAM_KEY.match(key) or MODULE_KEY.match(key):
        return True
    m = ROUTER_KEY.match(key)
    if m:
        what = "the MoE router" if m.group("module").endswith(".gate") else "Qwen2-MoE's shared expert gate"
        return f"LoRA on {what} ({m.group('module')}), which is not a LoRA target multilora serves"
    return False


@dataclass(frozen=True, slots=True)
class ExpertSpec:
    """One (layer, part) of an adapter's expert LoRA, from the header: rank r per expert, in / out features of the
    part, scaling, and where its tensors are. `param`: PEFT target_parameters (key A [E * r, in], key B
    [out_total, r * E], the part's rows lo..hi of B: gate rows first in gate_up_proj); `per_expert`: module LoRA,
    expert -> (key A [r, in], key B [out, r]) (experts left out are not adapted)."""

    layer: int
    part: str
    rank: int
    in_features: int
    out_features: int
    scaling: float
    full: str
    param: tuple[str, str, int, int] | None = None
    per_expert: tuple[tuple[int, str, str], ...] = ()


def check_dense_on_sparse(modules, module_names: dict, model_config, name: str) -> None:
    """A dense MLP LoRA (gate_proj / up_proj / down_proj) on a layer that is sparse in the base has no module to go
    to: refused (it would otherwise be dropped)."""
    for layer, module in modules:
        if module in ("gate_proj", "up_proj", "down_proj", "gate_up_proj") and model_config.is_sparse_layer(layer):
            full = module_names.get((layer, module), f"layers.{layer}.mlp.{module}")
            raise AdapterError(
                f"adapter {name!r}: {full} is a dense MLP LoRA, but layer {layer} of the base is a sparse MoE layer",
                hint="use an adapter made for this base (expert LoRA targets mlp.experts.gate_up_proj / down_proj)",
            )


def expert_specs(tf, keys: list[str], config, model_config, name: str) -> dict[tuple[int, str], ExpertSpec]:
    """The expert-LoRA `keys` of TensorFile `tf` checked from its header (shapes, ranks, layers) into
    {(layer, part): ExpertSpec}, sorted; raises AdapterError."""
    where = f"adapter {name!r}: {tf.file}"
    moe = model_config.moe if model_config is not None else None
    if moe is None:
        base = model_config.model_type if model_config is not None else "unknown"
        first = (MODULE_KEY.match(keys[0]) or PARAM_KEY.match(keys[0])).group("module") if keys else "experts"
        raise AdapterError(
            f"{where}: {first} is expert LoRA (mixture of experts), but the base model ({base}) has no experts",
            hint="pass the MoE base the adapter was trained on with --model",
        )
    E, H, inter = moe.num_experts, model_config.hidden_size, moe.intermediate_size
    out: dict[tuple[int, str], ExpertSpec] = {}
    per_expert: dict[tuple[int, str], dict[int, list[str]]] = {}
    params: dict[tuple[int, str], dict[str, str]] = {}
    for key in keys:
        m = MODULE_KEY.match(key)
        if m:
            full = m.group("module")
            slot = per_expert.setdefault((int(m.group("layer")), PART[m.group("name")]), {})
            slot.setdefault(int(m.group("e")), ["", "", full])[0 if m.group("ab") == "A" else 1] = key
            continue
        m = PARAM_KEY.match(key)
        params.setdefault((int(m.group("layer")), m.group("nest")), {"full": m.group("module")})[m.group("ab")] = key
    for (layer, _), pair in sorted(params.items()):
        if "A" not in pair or "B" not in pair:
            raise AdapterError(f"{where}: {pair['full']} has lora_A or lora_B without the other")
        a, b = tf.shape(pair["A"]), tf.shape(pair["B"])
        if len(a) != 2 or len(b) != 2 or a[0] != b[1] or a[0] % E:
            raise AdapterError(
                f"{where}: {pair['full']}: lora_A {tuple(a)} / lora_B {tuple(b)} "
                f"are not a [E * r, in] / [out, r * E] pair for {E} experts"
            )
        r = a[0] // E
        if (a[1], b[0]) == (H, 2 * inter):
            param = "gate_up_proj"
        elif (a[1], b[0]) == (inter, H):
            param = "down_proj"
        else:
            raise AdapterError(
                f"{where}: {pair['full']} maps {a[1]} -> {b[0]} features, which is neither "
                f"the base's experts.gate_up_proj ({H} -> {2 * inter}) nor down_proj ({inter} -> {H})"
            )
        full = f"{pair['full']}.{param}"  # PEFT's key for rank_pattern / alpha_pattern: module + parameter
        if r != config.rank_for(full):
            raise AdapterError(
                f"{where}: {full} has rank {r} per expert but adapter_config.json gives it r={config.rank_for(full)}",
                hint="fix adapter_config.json so PEFT and multilora agree",
            )
        s, ka, kb = config.scaling_for(full, r), pair["A"], pair["B"]
        if param == "gate_up_proj":  # gate rows, then up rows; A shared
            _put(out, ExpertSpec(layer, "gate", r, H, inter, s, full, param=(ka, kb, 0, inter)), where)
            _put(out, ExpertSpec(layer, "up", r, H, inter, s, full, param=(ka, kb, inter, 2 * inter)), where)
        else:
            _put(out, ExpertSpec(layer, "down", r, inter, H, s, full, param=(ka, kb, 0, H)), where)
    for (layer, part), by_e in sorted(per_expert.items()):
        fin, fout = (inter, H) if part == "down" else (H, inter)
        ranks = set()
        for e, (ka, kb, full) in by_e.items():
            if not ka or not kb or e >= E:
                raise AdapterError(f"{where}: {full}: incomplete pair, or expert {e} of a base with {E} experts")
            a, b = tf.shape(ka), tf.shape(kb)
            if len(a) != 2 or len(b) != 2 or a[1] != fin or tuple(b) != (fout, a[0]):
                raise AdapterError(
                    f"{where}: {full}: lora_A {tuple(a)} / lora_B {tuple(b)} do not fit "
                    f"the base's expert {part} ({fin} -> {fout})"
                )
            ranks.add(a[0])
        if len(ranks) != 1:
            raise AdapterError(f"{where}: layer {layer} expert {part}: experts have different ranks {sorted(ranks)}")
        r = ranks.pop()
        full = next(iter(by_e.values()))[2]
        keys_e = tuple((e, ka, kb) for e, (ka, kb, _) in sorted(by_e.items()))
        _put(out, ExpertSpec(layer, part, r, fin, fout, config.scaling_for(full, r), full, per_expert=keys_e), where)
    for layer, _ in out:
        if layer not in moe.sparse_layers:
            raise AdapterError(f"{where}: expert LoRA on layer {layer}, which is not a sparse layer of the base")
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], PARTS.index(kv[0][1]))))


def load_experts(
    tf, keys: list[str], config, model_config, name: str, specs: dict | None = None
) -> dict[tuple[int, str], tuple]:
    """Read the expert-LoRA `keys` of TensorFile `tf` into {(layer, part): (A [E, r, in], B [E, out, r], scaling)};
    `specs`: their `expert_specs` when already made (a scan's)."""
    where = f"adapter {name!r}: {tf.file}"
    E = model_config.moe.num_experts if model_config is not None and model_config.moe is not None else 0
    specs = specs or expert_specs(tf, keys, config, model_config, name)
    read: dict[str, torch.Tensor] = {}

    def get(key: str, layer: int) -> torch.Tensor:
        if key not in read:  # gate and up of a PEFT gate_up_proj share its tensors: read and checked once
            t = read[key] = tf.get(key)
            if not all_finite(t):  # on the tensor as stored (a permuted view's reduction is strided and slow)
                raise AdapterError(f"{where}: expert LoRA of layer {layer} contains NaN or Inf values")
        return read[key]

    out = {}
    for (layer, part), s in specs.items():
        r, fin, fout = s.rank, s.in_features, s.out_features
        if s.param is not None:
            ka, kb, lo, hi = s.param
            a_e = get(ka, layer).reshape(E, r, fin)  # [E, r, in]
            b_e = get(kb, layer)[lo:hi].reshape(hi - lo, r, E).permute(2, 0, 1)  # [E, out, r]
        else:
            tensors = [(e, get(ka, layer), get(kb, layer)) for e, ka, kb in s.per_expert]
            a_e = torch.zeros(E, r, fin, dtype=tensors[0][1].dtype)
            b_e = torch.zeros(E, fout, r, dtype=a_e.dtype)
            for e, a, b in tensors:
                a_e[e], b_e[e] = a, b
        out[(layer, part)] = (a_e, b_e, s.scaling)
    return out


def _put(out: dict, spec: ExpertSpec, where: str) -> None:
    key = (spec.layer, spec.part)
    if key in out:
        raise AdapterError(f"{where}: layer {key[0]} expert {key[1]} is adapted twice (both checkpoint layouts?)")
    out[key] = spec
