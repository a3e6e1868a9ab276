"""Capacity search: the cheapest deployment that meets the SLOs at a given traffic.

    workload: {trace: sharegpt-300, rate_scale: 4.0, max_requests: 300}
    cluster:                      # a cluster config without `replicas` (router, base, pd link, slo, seed)
      base: {hardware: {model: llama-3.1-8b, gpu: h100}}
      router: least_outstanding
      slo: {ttft_s: 1.0, tpot_s: 0.05}
    search:
      tp: [1, 2]
      pp: [1, 2]                                      # pipeline stages per replica (default [1])
      colocated: {min: 1, max: 8}                     # replica counts; omit to skip colocated
      pd: {ratios: [[1, 1], [1, 2]], max_scale: 4}    # (prefill, decode) x 1..max_scale; omit to skip
      goodput_threshold: 0.9                          # fraction of ALL requests meeting TTFT and TPOT
    gpu_cost_per_hour: {h100: 2.5}                    # $/h per GPU over the shipped table (specs/gpu_prices.yaml)
    autoscale: {...}                                  # optional: also the cheapest autoscaled fleet (plan_autoscale.py)

A shape is (colocated or a P:D ratio, TP, PP). Each shape is swept upwards in size and stops at the
first size that meets the SLO: larger sizes of that shape can only cost more. The cheapest point
that meets it is the recommendation; every evaluated point goes into the table, the CSV and the
cost-vs-goodput plot, with the Pareto frontier (no other point both cheaper-or-equal and better).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.simulator.cluster.cluster import run_cluster
from servesim.simulator.cluster.config import ClusterConfig, _known, cluster_config_from_dict, deep_merge
from servesim.traces.errors import InputError
from servesim.traces.workload import Workload

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)
class Shape:
    kind: str  # "colocated" | "pd"
    tp: int  # tensor-parallel degree of every replica
    ratio: tuple[int, int] | None = None  # (prefill, decode) replicas per unit, for kind "pd"
    pp: int = 1  # pipeline stages of every replica (each tp GPUs)

    @property
    def label(self) -> str:
        par = f"tp{self.tp}" + (f" pp{self.pp}" if self.pp > 1 else "")
        return f"colocated {par}" if self.ratio is None else f"P{self.ratio[0]}:D{self.ratio[1]} {par}"


@dataclass(slots=True)
class SearchSpace:
    tp: tuple[int, ...] = (1,)
    pp: tuple[int, ...] = (1,)  # pipeline stages tried with each tp
    colocated: tuple[int, int] | None = (1, 8)  # (min, max) replica count; None: no colocated shapes
    pd_ratios: tuple[tuple[int, int], ...] = ()  # (prefill, decode) units
    pd_max_scale: int = 4  # a ratio (p, d) is tried as (p*k, d*k) for k = 1..pd_max_scale
    goodput_threshold: float = 0.9  # fraction of all requests that must meet TTFT and TPOT
    # Replicates per candidate (servesim/replicate_plan.py): a candidate meets the SLO when at least
    # `probability` of its replicates reach the goodput threshold. 1: one run decides.
    replicates: int = 1
    probability: float = 0.9

    def shapes(self) -> list[Shape]:
        par = [(tp, pp) for tp in self.tp for pp in self.pp]
        out = [Shape("colocated", tp, None, pp) for tp, pp in par] if self.colocated is not None else []
        out += [Shape("pd", tp, r, pp) for tp, pp in par for r in self.pd_ratios]
        return out

    def sizes(self, shape: Shape) -> range:
        return range(self.colocated[0], self.colocated[1] + 1) if shape.kind == "colocated" \
            else range(1, self.pd_max_scale + 1)


@dataclass(slots=True)
class PlanConfig:
    cluster: dict[str, Any]  # cluster-config template (no replicas); validated per candidate
    search: SearchSpace
    workload: dict[str, Any] = field(default_factory=dict)  # {trace, format, max_requests, rate_scale}
    gpu_cost_per_hour: dict[str, float] = field(default_factory=dict)  # canonical GPU name -> $/h
    # The `autoscale:` section as given: the autoscaled fleets to try too (None: fixed fleets only);
    # plan_autoscale.autoscale_search reads and checks it (before any run).
    autoscale: dict[str, Any] | None = None

    @classmethod
    def from_yaml(cls, path: str | Path) -> PlanConfig:
        from servesim.simulator.yaml_input import read_text_bounded, safe_load_bounded

        text = read_text_bounded(path, "plan config")
        data = safe_load_bounded(text, str(path))
        return plan_config_from_dict(data, str(path))


def plan_config_from_dict(data: Any, path: str | None = None) -> PlanConfig:
    if not isinstance(data, dict):
        raise InputError("a plan config must be a mapping", path=path)
    _known(data, ("workload", "cluster", "search", "gpu_cost_per_hour", "autoscale"), "", path)
    cluster = data.get("cluster") or {}
    if not isinstance(cluster, dict) or "replicas" in cluster:
        raise InputError("cluster must be a mapping without replicas (the search chooses them)", path=path,
                         field="cluster")
    search = _search(data.get("search") or {}, path)
    costs = data.get("gpu_cost_per_hour") or {}
    if not isinstance(costs, dict) or any(not isinstance(v, (int, float)) or v < 0 for v in costs.values()):
        raise InputError("expected {gpu: dollars per hour >= 0}", path=path, field="gpu_cost_per_hour")
    from servesim.simulator.specs import resolve_gpu

    if path is not None and isinstance(cluster.get("base"), dict):  # a config.json relative to this file
        from servesim.simulator.cluster.config import models_near

        cluster = {**cluster, "base": models_near(cluster["base"], "cluster.base", path)}
    cfg = PlanConfig(cluster, search, dict(data.get("workload") or {}),
                     {resolve_gpu(k).name: float(v) for k, v in costs.items()})
    for shape in search.shapes()[:1] + [s for s in search.shapes() if s.kind == "pd"][:1]:
        candidate_config(cfg, shape, 1)  # fail early on a bad template, not after an hour of sweeping
    cfg.autoscale = data.get("autoscale")
    return cfg


def _search(raw: dict, path: str | None) -> SearchSpace:
    _known(raw, ("tp", "pp", "colocated", "pd", "goodput_threshold", "replicates", "probability"), "search.", path)
    tp, pp = (_degrees(raw, key, path) for key in ("tp", "pp"))
    col = raw.get("colocated", {"min": 1, "max": 8} if "pd" not in raw else None)
    colocated = None
    if col is not None:
        lo, hi = col.get("min", 1), col.get("max", 8)
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise InputError(f"got min={lo!r} max={hi!r}", path=path, field="search.colocated",
                             allowed="integers 1 <= min <= max")
        colocated = (lo, hi)
    pd_raw = raw.get("pd") or {}
    ratios = tuple(tuple(r) for r in pd_raw.get("ratios", []))
    if any(len(r) != 2 or any(not isinstance(x, int) or x < 1 for x in r) for r in ratios):
        raise InputError(f"got {pd_raw.get('ratios')!r}", path=path, field="search.pd.ratios",
                         allowed="[[prefill, decode], ...] with integers >= 1")
    scale = pd_raw.get("max_scale", 4)
    thr = raw.get("goodput_threshold", 0.9)
    if not isinstance(scale, int) or scale < 1:
        raise InputError(f"got {scale!r}", path=path, field="search.pd.max_scale", allowed="an integer >= 1")
    if not isinstance(thr, (int, float)) or not 0 < thr <= 1:
        raise InputError(f"got {thr!r}", path=path, field="search.goodput_threshold", allowed="a number in (0, 1]")
    if colocated is None and not ratios:
        raise InputError("nothing to search", path=path, field="search", allowed="colocated and/or pd.ratios")
    reps, prob = raw.get("replicates", 1), raw.get("probability", 0.9)
    if isinstance(reps, bool) or not isinstance(reps, int) or not 1 <= reps <= 1000:
        raise InputError(f"got {reps!r}", path=path, field="search.replicates", allowed="an integer from 1 to 1000")
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 < prob <= 1:
        raise InputError(f"got {prob!r}", path=path, field="search.probability", allowed="a number in (0, 1]")
    return SearchSpace(tp, pp, colocated, ratios, scale, float(thr), reps, float(prob))


def _degrees(raw: dict, key: str, path: str | None) -> tuple[int, ...]:
    values = raw.get(key, [1])
    if not isinstance(values, list) or not values or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                                                          for t in values):
        raise InputError(f"got {values!r}", path=path, field=f"search.{key}", allowed="a list of integers >= 1")
    return tuple(values)


def candidate_config(plan: PlanConfig, shape: Shape, size: int) -> ClusterConfig:
    sim = {"hardware": {"tp": shape.tp, "pp": shape.pp}}
    data = dict(plan.cluster)
    if shape.kind == "colocated":
        data["replicas"] = [{"count": size, "sim": sim}]
        data["pd"] = None
    else:
        p, d = shape.ratio
        data["replicas"] = [{"count": p * size, "role": "prefill", "sim": sim},
                            {"count": d * size, "role": "decode", "sim": sim}]
        data["pd"] = deep_merge({}, plan.cluster.get("pd") or {})
    return cluster_config_from_dict(data)


def cost_per_hour(plan: PlanConfig, cfg: ClusterConfig) -> float:
    """$/h of a fixed fleet: each GPU at its price (simulator/specs/gpu_prices.py: the shipped
    table under the plan's gpu_cost_per_hour)."""
    from servesim.simulator.specs.gpu_prices import price_per_gpu_hour

    return sum(g.count * g.sim.hardware.tp * g.sim.hardware.pp * price_per_gpu_hour(g.sim.hardware.gpu,
                                                                                       plan.gpu_cost_per_hour)
               for g in cfg.replicas)


def goodput_fraction(requests, slo) -> float:
    """Fraction of ALL requests that produced output within TTFT and TPOT (what the search's
    goodput_threshold is compared with). `requests`: a cluster's requests table (its columns or
    its frame); a missing TPOT (one output token) meets any."""
    tpot = np.asarray(requests["tpot_s"], dtype=float)
    good = ((np.asarray(requests["output_len"]) > 0) & (np.asarray(requests["ttft_s"], dtype=float) <= slo.ttft_s)
            & (np.where(np.isnan(tpot), 0.0, tpot) <= slo.tpot_s))
    return int(good.sum()) / max(len(requests), 1)


def evaluate(plan: PlanConfig, shape: Shape, size: int, workload: Workload) -> dict:
    cfg = candidate_config(plan, shape, size)
    t0 = time.perf_counter()
    res = run_cluster(cfg, workload)
    frac = goodput_fraction(res.metrics.columns().requests, cfg.slo)
    return {**candidate_row(plan, shape, size, cfg), "goodput_fraction": frac,
            "meets_slo": frac >= plan.search.goodput_threshold,
            "ttft_p90_s": res.summary["ttft_s"]["p90"], "tpot_p90_s": res.summary["tpot_s"]["p90"],
            "num_finished": res.summary["num_finished"], "num_rejected": res.summary["num_rejected"],
            "wall_s": time.perf_counter() - t0, "error": None}


def candidate_row(plan: PlanConfig, shape: Shape, size: int, cfg: ClusterConfig) -> dict:
    """The plan table's columns that describe a candidate (its figures are the evaluator's)."""
    n_p = sum(g.count for g in cfg.replicas if g.role == "prefill")
    n_d = sum(g.count for g in cfg.replicas if g.role == "decode")
    return {"shape": shape.label, "kind": shape.kind, "tp": shape.tp, "pp": shape.pp, "size": size,
            "num_replicas": cfg.num_replicas, "num_prefill": n_p, "num_decode": n_d, "num_gpus": cfg.num_gpus,
            "cost": cost_per_hour(plan, cfg)}


Evaluate = Callable[[PlanConfig, Shape, int, Workload], dict]


def search(plan: PlanConfig, workload: Workload, progress: Callable[[dict], None] | None = None,
           evaluate: Evaluate = evaluate) -> pd.DataFrame:
    """Sweep every shape upwards, stopping a shape at its first size that meets the SLO. ``evaluate``
    runs one candidate into a row (one run here; servesim/replicate_plan.py's over replicates)."""
    rows = []
    for shape in plan.search.shapes():
        for size in plan.search.sizes(shape):
            try:
                row = evaluate(plan, shape, size, workload)
            except InputError as e:  # e.g. the model does not fit at this TP: the whole shape is out
                row = {"shape": shape.label, "kind": shape.kind, "tp": shape.tp, "pp": shape.pp, "size": size,
                       "meets_slo": False,
                       "goodput_fraction": math.nan, "cost": math.nan, "error": str(e)}
            rows.append(row)
            if progress is not None:
                progress(row)
            if row["meets_slo"] or row["error"] is not None:
                break
    import pandas as pd  # the plan table (imported here: a cluster run reading this module needs no pandas)

    return mark_frontier(pd.DataFrame(rows), plan.search.goodput_threshold)


def mark_frontier(df: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Adds `frontier` (Pareto: lowest cost for its goodput) and `best` (cheapest meeting the SLO;
    ties go to the higher goodput)."""
    df = df.copy()
    df["frontier"] = False
    df["best"] = False
    valid = df[df["error"].isna()].sort_values(["cost", "goodput_fraction"], ascending=[True, False])
    best_goodput = -1.0
    for idx, row in valid.iterrows():
        if row["goodput_fraction"] > best_goodput:
            df.loc[idx, "frontier"] = True
            best_goodput = row["goodput_fraction"]
    meeting = valid[valid["meets_slo"]]
    if not meeting.empty:
        df.loc[meeting.index[0], "best"] = True
    return df


def load_plan_workload(spec: dict, trace: str | None = None, base_dir: str | Path | None = None) -> Workload:
    """The plan's workload: a bundled sample name or a trace path (relative paths: to base_dir when
    the file is there, e.g. the config's folder), then rate_scale and max_requests."""
    from servesim.traces.bundled import BUNDLED_TRACES, DEFAULT_TRACE, load_bundled
    from servesim.traces.formats import load_workload
    from servesim.traces.transforms import rate_scale, request_limit

    _known(spec, ("trace", "format", "rate_scale", "max_requests"), "workload.", None)
    name = trace or spec.get("trace") or DEFAULT_TRACE
    if name in BUNDLED_TRACES:
        wl = load_bundled(name)
    else:
        p = Path(name)
        if not p.is_absolute() and base_dir is not None and (Path(base_dir) / p).exists():
            p = Path(base_dir) / p
        wl = load_workload(p, spec.get("format", "auto"))
    if spec.get("rate_scale") not in (None, 1, 1.0):
        wl = rate_scale(wl, float(spec["rate_scale"]))
    if spec.get("max_requests") is not None:
        wl = request_limit(wl, int(spec["max_requests"]))
    return wl
