"""The report's figures over a sweep of tenant counts: the data behind `economics --plot` and its terminal view.

Each point is a whole report (`analyze`) of the same resolved scenario with only the tenant count changed, so a
curve's value at N tenants is exactly what `multilora economics --tenants N --max-loras M --json` prints: there
is no second formula. The slots stay at the given scenario's `--max-loras` (or the default it resolved to), so
the hit-rate curve shows what that one setting does as tenants grow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from multilora_cli.economics.analysis import analyze
from multilora_cli.economics.report import Report
from multilora_cli.economics.scenario import MAX_TENANTS, Resolved

SWEEP_POINTS = 25  # log-spaced tenant counts from 1 to 10x the given ones (fewer where integers repeat)
SWEEP_FACTOR = 10

# curve name -> (report section, figure key): where each point's value is read from
SERIES: dict[str, tuple[str, str]] = {
    "dedicated_gpus": ("fleet", "dedicated_gpus"),
    "shared_gpus": ("fleet", "shared_gpus"),
    "usd_per_month_dedicated": ("fleet", "usd_per_month_dedicated"),
    "usd_per_month_shared": ("fleet", "usd_per_month_shared"),
    "tenants_per_replica": ("slots", "tenants_per_replica"),
    "hit_rate": ("slots", "hit_rate"),
    "loads_per_step": ("slots", "loads_per_step"),
    "max_loads_per_step_pcie": ("slots", "max_loads_per_step_pcie"),
}


@dataclass(slots=True, frozen=True)
class TenantCurves:
    """Figures of the report at each tenant count of `tenants` (ascending; `given` is one of them)."""

    tenants: tuple[int, ...]
    given: int  # the scenario's own --tenants
    max_loras: int  # slots at every point
    popularity: str  # as the assumptions table prints it: "uniform" | "zipf s=1.1"
    dedicated_gpus: tuple[int, ...]
    shared_gpus: tuple[int, ...]
    usd_per_month_dedicated: tuple[float, ...]
    usd_per_month_shared: tuple[float, ...]
    tenants_per_replica: tuple[int, ...]
    hit_rate: tuple[float, ...]
    loads_per_step: tuple[float, ...]
    max_loads_per_step_pcie: tuple[float, ...]  # host-to-GPU bandwidth limit: loads that fill one decode step

    @property
    def given_index(self) -> int:
        return self.tenants.index(self.given)

    def at(self, name: str, tenants: int):
        """The value of curve `name` at `tenants` (one of the sweep's points)."""
        return getattr(self, name)[self.tenants.index(tenants)]


def tenant_points(given: int, points: int = SWEEP_POINTS, factor: int = SWEEP_FACTOR) -> list[int]:
    """Log-spaced integers from 1 to `factor` x `given` (at most MAX_TENANTS), with `given` among them."""
    hi = min(max(given * factor, 2), MAX_TENANTS)
    grid = np.unique(np.round(np.geomspace(1, hi, points)).astype(np.int64))
    return sorted({int(t) for t in grid} | {given})


def tenant_curves(r: Resolved, given: Report | None = None, points: list[int] | None = None) -> TenantCurves:
    """Sweep `r` over `points` tenant counts (default `tenant_points`), slots fixed at `r.max_loras`.

    `given`: the report already computed for `r` itself, reused at its own tenant count.
    """
    s = r.scenario
    points = points if points is not None else tenant_points(s.tenants)
    values: dict[str, list] = {name: [] for name in SERIES}
    for t in points:
        if given is not None and t == s.tenants:  # r.max_loras is what the given report ran with
            report = given
        else:
            # the sweep's reports carry figures only: their assumptions would repeat the given tenant count
            scenario = replace(s, tenants=t, max_loras=r.max_loras)
            report = analyze(replace(r, scenario=scenario, assumptions=[]))
        for name, (section, key) in SERIES.items():
            values[name].append(report.section(section)[key])
    popularity = s.popularity if s.popularity == "uniform" else f"zipf s={s.zipf_s}"
    return TenantCurves(
        tenants=tuple(points),
        given=s.tenants,
        max_loras=r.max_loras,
        popularity=popularity,
        **{name: tuple(v) for name, v in values.items()},
    )
