"""The slot sweep of issue 38: each workload's row with the default slots (`multilora run`'s rule,
engine/slot_budget.py) against the best row of the same workload with a given `--max-loras`, and, for uniform
requests, against the 64-adapter row of the same preset and request count.

Targets: default >= 0.95x the best of the sweep; with uniform requests, >= 0.6x the 64-adapter figure.
"""

from __future__ import annotations

DEFAULT_VS_BEST = 0.95
VS_64 = 0.6


def _is_default(row: dict) -> bool:
    return not row["extra"].get("slots", {}).get("reason", "--max-loras").startswith("--max-loras")


def slot_sweep(rows: list[dict], reference_adapters: int = 64) -> list[dict]:
    """One entry per workload (preset, adapters, spread, requests) that has a default-slots row and other rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["system"] != "multilora":
            continue
        w = r["workload"]
        groups.setdefault((w["preset"], w["num_adapters"], w["distribution"], w["num_requests"]), []).append(r)
    out = []
    for (preset, n, dist, reqs), rs in groups.items():
        default = next((r for r in reversed(rs) if _is_default(r)), None)
        if default is None or n == reference_adapters:
            continue
        best = max(rs, key=lambda r: r["tokens_per_s"])
        ref = next(
            (
                r
                for r in reversed(rows)
                if r["system"] == "multilora"
                and r["workload"]["preset"] == preset
                and r["workload"]["num_adapters"] == reference_adapters
                and r["workload"]["distribution"] == "uniform"
                and r["workload"]["num_requests"] == reqs
            ),
            None,
        )
        e = {
            "preset": preset,
            "adapters": n,
            "distribution": dist,
            "requests": reqs,
            "default_slots": default["workload"]["max_loras"],
            "default_tokens_per_s": default["tokens_per_s"],
            "best_slots": best["workload"]["max_loras"],
            "best_tokens_per_s": best["tokens_per_s"],
            "default_vs_best": default["tokens_per_s"] / best["tokens_per_s"],
            "vs_64": default["tokens_per_s"] / ref["tokens_per_s"] if ref is not None and dist == "uniform" else None,
            "swept": sorted(r["workload"]["max_loras"] for r in rs),
        }
        e["met"] = e["default_vs_best"] >= DEFAULT_VS_BEST and (e["vs_64"] is None or e["vs_64"] >= VS_64)
        out.append(e)
    return out


def sweep_lines(sweeps: list[dict]) -> list[str]:
    """Markdown table of `slot_sweep` entries (empty when there are none)."""
    if not sweeps:
        return []
    lines = [
        "",
        f"| slots sweep | default slots | default tok/s | best slots | best tok/s | default/best (>= {DEFAULT_VS_BEST}) "
        f"| vs 64 adapters (>= {VS_64}) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in sweeps:
        vs64 = "-" if e["vs_64"] is None else f"{e['vs_64']:.2f}"
        lines.append(
            f"| {e['preset']} {e['adapters']} {e['distribution']} x{e['requests']} | {e['default_slots']} "
            f"| {e['default_tokens_per_s']:.0f} | {e['best_slots']} | {e['best_tokens_per_s']:.0f} "
            f"| {e['default_vs_best']:.2f} | {vs64} | {'met' if e['met'] else 'missed'} |"
        )
    return lines
