"""Row specs for the benchmark command and script: a short string per row.

64        multilora, 64 adapters, uniform, multilora run's default slots (engine/slot_budget.py)
256/64    multilora, 256 adapters through 64 slots
64z       the same with a zipf spread over adapters
base      multilora, base model only (no LoRA layers)
eager64   multilora with 64 adapters, CUDA graphs off
dora64    multilora, 64 DoRA adapters (the same LoRA weights plus magnitude vectors), min(64, N) slots
hf64      HF transformers + PEFT, 64 adapters
"""

from __future__ import annotations

import re
from dataclasses import replace

from multilora_cli.bench.workload import Workload
from multilora_cli.errors import UsageError

DEFAULT_ROWS = "64,base,hf64,256/64,64z,8,1,256/256"
_SPEC = re.compile(r"^(eager|hf|dora)?(\d+)(?:/(\d+))?(z)?$")


def parse_rows(spec: str, base: Workload) -> list[tuple[str, Workload]]:
    """'64,base,hf64,256/64' -> [(kind, workload)], kinds "multilora" | "base" | "eager" | "hf" | "dora"."""
    plan = []
    for item in (s.strip().lower() for s in spec.split(",")):
        if not item:
            continue
        if item == "base":
            plan.append(("base", replace(base, num_adapters=0, max_loras=1)))
            continue
        m = _SPEC.match(item)
        if m is None:
            raise UsageError(
                f"bad benchmark row {item!r}",
                hint="use N, N/SLOTS, Nz (zipf), base, eagerN, doraN or hfN, e.g. 64,base,hf64,256/64",
            )
        kind = m.group(1) or "multilora"
        n = int(m.group(2))
        slots = int(m.group(3)) if m.group(3) else None
        if slots == 0:  # the spec's own words, not Workload's "--max-loras" (a row may not come from that flag)
            raise UsageError(f"bad benchmark row {item!r}: 0 slots", hint="N/SLOTS needs SLOTS >= 1, e.g. 256/64")
        if kind == "hf":  # HF + PEFT holds every adapter: no slots
            slots = max(1, n)
        w = replace(base, num_adapters=n, max_loras=slots, distribution="zipf" if m.group(4) else base.distribution)
        plan.append((kind, w))
    if not plan:
        raise UsageError("no benchmark rows given")
    return plan
