"""The cheapest autoscaled fleet that meets the SLO over the plan's workload (e.g. a diurnal day),
beside the cheapest fixed fleet of `servesim plan` (plan.py).

    autoscale:                                         # in a plan config
      policy: {name: target_utilization, params: {metric: outstanding}}
      sweep: {param: target, values: [4, 8, 16]}       # the policy parameter tried
      min_replicas: [1, 2]                             # each tried (the fleet starts at its minimum)
      max_replicas: 8                                  # default: search.colocated.max
      interval_s: 15
      window_s: 60
      pool: {scale_down_stabilization_s: 300, cold_start: {provision_s: 0}}   # any other pool field

Each colocated shape of the search (TP x PP) is tried with every (min_replicas, value) pair; a
candidate's cost is what the run billed (simulator/cluster/autoscale/cost.py: GPU-hours over the
replica timeline, cold starts included), per day. The fixed fleets' cost per day is their $/h x 24.
Both are compared on the same goodput (plan.goodput_fraction) and threshold.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servesim.simulator.cluster.autoscale.config import (
    AutoscaleConfig, PolicyConfig, PoolConfig, autoscale_config_from_dict,
)
from servesim.simulator.cluster.cluster import run_cluster
from servesim.simulator.cluster.config import _known
from servesim.simulator.cluster.plan import PlanConfig, Shape, candidate_config, goodput_fraction
from servesim.traces.errors import InputError
from servesim.traces.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

_KEYS = ("policy", "sweep", "min_replicas", "max_replicas", "interval_s", "window_s", "percentile", "pool")


@dataclass(slots=True)
class AutoscaleSearch:
    policy: PolicyConfig
    param: str  # the policy parameter swept
    values: tuple[Any, ...]
    min_replicas: tuple[int, ...]
    max_replicas: int
    settings: dict[str, Any] = field(default_factory=dict)  # interval_s, window_s, percentile
    pool: dict[str, Any] = field(default_factory=dict)  # other PoolConfig fields, as YAML gives them


def autoscale_search(plan: PlanConfig, path: str | None = None) -> AutoscaleSearch | None:
    """The plan's `autoscale:` section, checked: every candidate's autoscale config is built once
    here, so bad input fails before the sweep (None: the plan has no such section)."""
    raw = plan.autoscale
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("autoscale must be a mapping", path=path, field="autoscale", allowed=", ".join(_KEYS))
    _known(raw, _KEYS, "autoscale.", path)
    policy = raw.get("policy", {"name": "target_utilization"})
    policy = {"name": policy} if isinstance(policy, str) else policy
    if not isinstance(policy, dict) or not isinstance(policy.get("params", {}), dict):
        raise InputError(f"got {policy!r}", path=path, field="autoscale.policy", allowed="a name or {name, params}")
    sweep = raw.get("sweep") or {}
    _known(sweep, ("param", "values"), "autoscale.sweep.", path)
    values = sweep.get("values", [None])
    if not isinstance(values, list) or not values:
        raise InputError(f"got {values!r}", path=path, field="autoscale.sweep.values", allowed="a non-empty list")
    mins = raw.get("min_replicas", [1])
    mins = [mins] if isinstance(mins, int) and not isinstance(mins, bool) else mins
    if not isinstance(mins, list) or not mins or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in mins):
        raise InputError(f"got {mins!r}", path=path, field="autoscale.min_replicas", allowed="integers >= 1")
    top = plan.search.colocated[1] if plan.search.colocated is not None else max(mins)
    out = AutoscaleSearch(PolicyConfig(str(policy.get("name", "target_utilization")), dict(policy.get("params") or {})),
                          str(sweep.get("param", "target")), tuple(values), tuple(mins), raw.get("max_replicas", top),
                          {k: raw[k] for k in ("interval_s", "window_s", "percentile") if k in raw},
                          dict(raw.get("pool") or {}))
    if plan.search.colocated is None:
        raise InputError("autoscaled fleets are searched on the colocated shapes", path=path,
                         field="search.colocated", allowed="a colocated range")
    shape = next(s for s in plan.search.shapes() if s.kind == "colocated")
    for m in out.min_replicas:
        for v in out.values:
            candidate(plan, out, shape, m, v, path)
    return out


def candidate(plan: PlanConfig, search: AutoscaleSearch, shape: Shape, min_replicas: int, value: Any,
              path: str | None = None):
    """The cluster config of one autoscaled candidate: `min_replicas` replicas of the shape to start."""
    params = dict(search.policy.params)
    if value is not None:
        params[search.param] = value
    raw = {**search.settings, "pools": [{**search.pool, "group": "both", "min_replicas": min_replicas,
                                          "max_replicas": search.max_replicas,
                                          "policy": {"name": search.policy.name, "params": params}}]}
    auto: AutoscaleConfig = autoscale_config_from_dict(raw, path)
    base = candidate_config(plan, shape, min_replicas)
    return dataclasses.replace(base, autoscale=auto, gpu_cost_per_hour=dict(plan.gpu_cost_per_hour))


def search_autoscaled(plan: PlanConfig, search: AutoscaleSearch, workload: Workload,
                      progress: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """Every (shape, min_replicas, value) candidate run on the workload; `best` marks the cheapest
    per day that meets the SLO (ties: the higher goodput)."""
    rows = []
    for shape in (s for s in plan.search.shapes() if s.kind == "colocated"):
        for m in search.min_replicas:
            for v in search.values:
                rows.append(_evaluate(plan, search, shape, m, v, workload))
                if progress is not None:
                    progress(rows[-1])
    import pandas as pd  # the plan table (imported here: the router registry imports this module)

    df = pd.DataFrame(rows)
    df["best"] = False
    ok = df[df["meets_slo"]].sort_values(["usd_per_day", "goodput_fraction"], ascending=[True, False])
    if not ok.empty:
        df.loc[ok.index[0], "best"] = True
    return df


def _evaluate(plan: PlanConfig, search: AutoscaleSearch, shape: Shape, m: int, v: Any, workload: Workload) -> dict:
    row = {"shape": shape.label, "tp": shape.tp, "pp": shape.pp, "policy": search.policy.name, "param": search.param,
           "value": v, "min_replicas": m, "max_replicas": search.max_replicas}
    t0 = time.perf_counter()
    try:
        cfg = candidate(plan, search, shape, m, v)
        res = run_cluster(cfg, workload)
    except InputError as e:  # e.g. the model does not fit at this TP
        return {**row, "meets_slo": False, "goodput_fraction": math.nan, "usd_per_day": math.nan, "error": str(e)}
    frac = goodput_fraction(res.metrics.columns().requests, cfg.slo)
    c, a = res.summary["cost"], res.summary["autoscale"]
    return {**row, "goodput_fraction": frac, "meets_slo": frac >= plan.search.goodput_threshold,
            "usd": c["usd"], "usd_per_day": c["usd_per_day"], "gpu_hours": c["gpu_hours"],
            "duration_s": c["duration_s"], "max_replicas_alive": a["max_replicas_alive"],
            "num_cold_starts": a["num_cold_starts"], "ttft_p90_s": res.summary["ttft_s"]["p90"],
            "tpot_p90_s": res.summary["tpot_s"]["p90"], "wall_s": time.perf_counter() - t0, "error": None}


def static_vs_autoscaled(static: pd.DataFrame, autoscaled: pd.DataFrame) -> dict:
    """The two answers side by side: each cheapest meeting the SLO, $ per day (None: none met it)."""
    s = static[static["best"]]
    a = autoscaled[autoscaled["best"]]
    return {"static": None if s.empty else {"shape": s.iloc[0]["shape"], "num_replicas": int(s.iloc[0]["num_replicas"]),
                                            "usd_per_day": float(s.iloc[0]["cost"]) * 24.0,
                                            "goodput_fraction": float(s.iloc[0]["goodput_fraction"])},
            "autoscaled": None if a.empty else {"shape": a.iloc[0]["shape"], "min_replicas": int(a.iloc[0]["min_replicas"]),
                                                "max_replicas": int(a.iloc[0]["max_replicas"]),
                                                "policy": f"{a.iloc[0]['policy']} {a.iloc[0]['param']}={a.iloc[0]['value']}",
                                                "usd_per_day": float(a.iloc[0]["usd_per_day"]),
                                                "goodput_fraction": float(a.iloc[0]["goodput_fraction"])}}
