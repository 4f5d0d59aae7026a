"""Stats of a data-parallel run: the workers' EngineStats merged into one, plus a per-worker section.

The merged dict has EngineStats.to_dict()'s keys, so the run's stats JSON reads the same for 1 or N workers:
counters are summed, `wall_seconds` is rank 0's generation time over the whole set (what the run took), and
tokens/s = all workers' tokens over that time. `data_parallel` adds, per worker: where it ran, requests and
tokens it served, its own generation seconds and tokens/s, adapters it was given and its slot loads.
"""

from __future__ import annotations

from collections import Counter

from multilora_cli.engine.request import prefix_cache_stats

SUMMED = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "steps",
    "prefill_steps",
    "decode_steps",
    "ahead_steps",
    "preemptions",
    "slot_loads",
    "slot_hits",
    "slot_evictions",
    "prefix_prompt_tokens",
    "prefix_hit_tokens",
)
ADAPTER_SUMMED = ("requests", "prompt_tokens", "completion_tokens", "slot_loads")


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _devices(devices: list[str]) -> str:
    """'2 x cpu', or 'cuda:0, cuda:1'."""
    if len(set(devices)) == 1:
        return f"{len(devices)} x {devices[0]}"
    return ", ".join(devices) if len(devices) <= 8 else f"{len(devices)} devices"


def merge_stats(de) -> dict:
    """The merged EngineStats dict of a DistributedEngine `de` (workers that never reported count as empty)."""
    world = de.ctx.world
    per = {0: de.local.stats.to_dict(), **de.worker_stats}
    parts = [per.get(r, {}) for r in range(world)]
    first = parts[0]
    merged: dict = {k: first.get(k, "") for k in ("model", "dtype")}
    for k in SUMMED:
        merged[k] = sum(int(p.get(k, 0)) for p in parts)
    merged["max_loras"], merged["max_lora_rank"] = first.get("max_loras", 0), first.get("max_lora_rank", 0)
    merged["device"] = _devices(
        [de.info.get(r, {}).get("device") or parts[r].get("device") or "?" for r in range(world)]
    )
    merged["wall_seconds"] = de.wall_seconds
    per_adapter: dict[str, Counter] = {}
    for p in parts:
        for name, a in (p.get("per_adapter") or {}).items():
            c = per_adapter.setdefault(name, Counter())
            for k in ADAPTER_SUMMED:
                c[k] += int(a.get(k, 0))
    merged["per_adapter"] = {n: {k: c[k] for k in ADAPTER_SUMMED} for n, c in sorted(per_adapter.items())}
    total = merged["prompt_tokens"] + merged["completion_tokens"]
    merged["tokens_per_second"] = _rate(total, de.wall_seconds)
    merged["completion_tokens_per_second"] = _rate(merged["completion_tokens"], de.wall_seconds)
    merged["prefix_cache"] = prefix_cache_stats(merged["prefix_prompt_tokens"], merged["prefix_hit_tokens"])
    summary = de.summary
    workers = []
    for r in range(world):
        p, info = parts[r], de.info.get(r, {})
        tokens = int(p.get("prompt_tokens", 0)) + int(p.get("completion_tokens", 0))
        secs = float(p.get("wall_seconds", 0.0))
        workers.append(
            {
                "rank": r,
                "host": info.get("host", ""),
                "pid": info.get("pid"),
                "device": info.get("device", ""),
                "load_seconds": info.get("load_seconds"),
                "requests": int(p.get("requests", 0)),
                "errors": int(p.get("errors", 0)),
                "prompt_tokens": int(p.get("prompt_tokens", 0)),
                "completion_tokens": int(p.get("completion_tokens", 0)),
                "wall_seconds": round(secs, 4),
                "tokens_per_second": _rate(tokens, secs),
                "assigned_requests": summary.requests[r],
                "assigned_adapters": summary.adapters[r],
                "estimated_tokens": summary.tokens[r],
                "slot_loads": int(p.get("slot_loads", 0)),
                "slot_evictions": int(p.get("slot_evictions", 0)),
            }
        )
    merged["data_parallel"] = {
        "world_size": world,
        "launcher": de.ctx.launcher,
        "sharding": de.sharding,
        "tokens_per_second": merged["tokens_per_second"],
        "adapters_split": summary.to_dict()["adapters_split"],
        "estimated_imbalance": round(summary.imbalance, 4),
        "workers": workers,
    }
    return merged


def print_workers(stats: dict, console=None) -> None:
    """A per-worker table of the stats JSON's "data_parallel" section, on stderr."""
    from rich.table import Table

    from multilora_cli.io.progress import stderr_console

    dp = stats.get("data_parallel")
    if not dp:
        return
    console = console or stderr_console()
    t = Table(
        title=f"data parallel: {dp['world_size']} workers ({dp['launcher']}, {dp['sharding']} sharding, "
        f"{dp['adapters_split']} adapters split)",
        title_justify="left",
    )
    for col in ("worker", "device", "requests", "tokens", "tok/s", "adapters", "slot loads"):
        t.add_column(col, justify="left" if col in ("worker", "device") else "right")
    for w in dp["workers"]:
        where = w["device"] + (f" @ {w['host']}" if w.get("host") else "")
        t.add_row(
            str(w["rank"]),
            where,
            str(w["requests"]),
            f"{w['prompt_tokens'] + w['completion_tokens']:,}",
            f"{w['tokens_per_second']:,.1f}",
            str(w["assigned_adapters"]),
            str(w["slot_loads"]),
        )
    console.print(t)
