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

import torch

from multilora_cli.errors import AdapterError

_PRE = r"^(?:base_model\.model\.)?(?P<module>(?:[A-Za-z0-9_.]*\.)?layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe)"
_SUF = r"\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$"
PARAM_KEY = re.compile(_PRE + r"\.experts)(?P<nest>(?:\.base_layer)*)" + _SUF)
MODULE_KEY = re.compile(_PRE + r"\.experts\.(?P<e>\d+)\.(?P<name>w1|w2|w3|gate_proj|up_proj|down_proj))" + _SUF)
ROUTER_KEY = re.compile(_PRE + r"\.(?:gate|shared_expert_gate))\.lora_")
SHARED_KEY = re.compile(_PRE + r"\.shared_expert\.(?P<name>gate_proj|up_proj|down_proj))" + _SUF)
PART = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
EXPERT_PARAMS = ("experts.gate_up_proj", "experts.down_proj")


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


class _Header:
    """A TensorFile stand-in giving shape-only (meta) tensors: `check_experts` validates from the header alone."""

    def __init__(self, tf):
        self.file, self._tf = tf.file, tf

    def get(self, key: str) -> torch.Tensor:
        return torch.empty(self._tf.shape(key), dtype=self._tf.dtype(key), device="meta")


def check_experts(tf, keys: list[str], config, model_config, name: str) -> int:
    """Every check `load_experts` makes but NaN/Inf, from the safetensors header (no tensor read); returns the
    largest expert rank (0 without expert LoRA)."""
    parts = load_experts(_Header(tf), keys, config, model_config, name)
    return max((a.shape[1] for a, _, _ in parts.values()), default=0)


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


def load_experts(tf, keys: list[str], config, model_config, name: str) -> dict[tuple[int, str], tuple]:
    """Read the expert-LoRA `keys` of TensorFile `tf` into {(layer, part): (A [E, r, in], B [E, out, r], scaling)}."""
    where = f"adapter {name!r}: {tf.file}"
    meta = isinstance(tf, _Header)
    moe = model_config.moe if model_config is not None else None
    if moe is None:
        base = model_config.model_type if model_config is not None else "unknown"
        first = (MODULE_KEY.match(keys[0]) or PARAM_KEY.match(keys[0])).group("module") if keys else "experts"
        raise AdapterError(
            f"{where}: {first} is expert LoRA (mixture of experts), but the base model ({base}) has no experts",
            hint="pass the MoE base the adapter was trained on with --model",
        )
    E, H, inter = moe.num_experts, model_config.hidden_size, moe.intermediate_size
    out: dict[tuple[int, str], tuple] = {}
    per_expert: dict[tuple[int, str], dict[int, tuple[str, str]]] = {}
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
        a, b = tf.get(pair["A"]), tf.get(pair["B"])
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] % E:
            raise AdapterError(
                f"{where}: {pair['full']}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} "
                f"are not a [E * r, in] / [out, r * E] pair for {E} experts"
            )
        r = a.shape[0] // E
        if (a.shape[1], b.shape[0]) == (H, 2 * inter):
            param = "gate_up_proj"
        elif (a.shape[1], b.shape[0]) == (inter, H):
            param = "down_proj"
        else:
            raise AdapterError(
                f"{where}: {pair['full']} maps {a.shape[1]} -> {b.shape[0]} features, which is neither "
                f"the base's experts.gate_up_proj ({H} -> {2 * inter}) nor down_proj ({inter} -> {H})"
            )
        full = f"{pair['full']}.{param}"  # PEFT's key for rank_pattern / alpha_pattern: module + parameter
        if r != config.rank_for(full):
            raise AdapterError(
                f"{where}: {full} has rank {r} per expert but adapter_config.json gives it r={config.rank_for(full)}",
                hint="fix adapter_config.json so PEFT and multilora agree",
            )
        a_e = a.reshape(E, r, a.shape[1])  # [E, r, in]
        b_e = b.reshape(b.shape[0], r, E).permute(2, 0, 1)  # [E, out, r]
        scaling = config.scaling_for(full, r)
        if param == "gate_up_proj":  # gate rows, then up rows; A shared
            _put(out, (layer, "gate"), (a_e, b_e[:, :inter], scaling), where)
            _put(out, (layer, "up"), (a_e, b_e[:, inter:], scaling), where)
        else:
            _put(out, (layer, "down"), (a_e, b_e, scaling), where)
    for (layer, part), by_e in sorted(per_expert.items()):
        fin, fout = (inter, H) if part == "down" else (H, inter)
        ranks = set()
        tensors = {}
        for e, (ka, kb, full) in by_e.items():
            if not ka or not kb or e >= E:
                raise AdapterError(f"{where}: {full}: incomplete pair, or expert {e} of a base with {E} experts")
            a, b = tf.get(ka), tf.get(kb)
            if tuple(a.shape) != (a.shape[0], fin) or tuple(b.shape) != (fout, a.shape[0]):
                raise AdapterError(
                    f"{where}: {full}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit "
                    f"the base's expert {part} ({fin} -> {fout})"
                )
            ranks.add(a.shape[0])
            tensors[e] = (a, b, full)
        if len(ranks) != 1:
            raise AdapterError(f"{where}: layer {layer} expert {part}: experts have different ranks {sorted(ranks)}")
        r = ranks.pop()
        dev = "meta" if meta else "cpu"
        a_e = torch.zeros(E, r, fin, dtype=next(iter(tensors.values()))[0].dtype, device=dev)
        b_e = torch.zeros(E, fout, r, dtype=a_e.dtype, device=dev)
        for e, (a, b, _) in tensors.items():
            a_e[e], b_e[e] = a, b
        full = next(iter(tensors.values()))[2]
        _put(out, (layer, part), (a_e, b_e, config.scaling_for(full, r)), where)
    for (layer, _), (a, b, _) in out.items():
        if layer not in moe.sparse_layers:
            raise AdapterError(f"{where}: expert LoRA on layer {layer}, which is not a sparse layer of the base")
        if not meta and not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"{where}: expert LoRA of layer {layer} contains NaN or Inf values")
    return out


def _put(out: dict, key: tuple[int, str], value: tuple, where: str) -> None:
    if key in out:
        raise AdapterError(f"{where}: layer {key[0]} expert {key[1]} is adapted twice (both checkpoint layouts?)")
    out[key] = value
