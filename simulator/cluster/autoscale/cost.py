"""What a cluster run cost, and the autoscaler's record of it, for the cluster summary and files.

GPU-hours are integrated over each replica's life on the cluster clock: from the decision that
asked for it (its cold start is billed: the node is rented from provisioning on) until it was
removed (drained or cancelled), or the run's end. A fixed fleet lives from 0 to the end. Dollars
are GPU-hours times the price of the replica's GPU (simulator/specs/gpu_prices.py: the shipped
table under the config's gpu_cost_per_hour).

    usd_per_day = usd / duration_s x 86,400        (the run's rate of spend, over a day)
    usd_per_million_tokens = usd / (prompt + output tokens of the requests served) x 1e6
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster

@dataclass(slots=True)
class Lifetime:
    """One replica's life on the cluster clock (what its GPU-hours are billed over)."""

    pool: str
    name: str
    num_gpus: int
    gpu: str
    start_s: float  # the decision that asked for it (0 for the initial fleet: warm at the start)
    ready_s: float | None = None  # cold start over (None: cancelled before)
    drain_s: float | None = None
    end_s: float | None = None  # removed (drained or cancelled); None: alive at the run's end
    replica: int | None = None  # its Replica.index once built


# What the fast path does under autoscaling (controller.py), stated in the summary.
DEFERRED_DECLINED = "deferred runs declined: a decision reads KV usage and queues, not only the load"


def _router_proof_note(cluster: Cluster) -> str:
    from servesim.simulator.cluster.autoscale.controller import PROVED_ROUTERS

    if cluster._proof is not None:
        return (f"{cluster.router.name}'s proof, rebuilt at each change of the candidate set; runs stop at the next "
                "decision or cold-start end")
    why = "not proved exact when the candidate set changes" if cluster.router.name not in PROVED_ROUTERS \
        else "no replica runs macro-steps" if cluster.cfg.pd is None else "P/D"
    return f"declined ({why}): runs stop at every dispatch and decision"


def lifetimes(cluster: Cluster) -> list[Lifetime]:
    """Every replica's life, built or cancelled (a fixed fleet: each from 0 to the end)."""
    a = cluster.autoscaler
    fixed = [Lifetime(r.name, r.name, r.cfg.hardware.tp * r.cfg.hardware.pp, r.cfg.hardware.gpu, 0.0, 0.0,
                      replica=r.index) for r in cluster.replicas if a is None or r.index not in a.lifetimes]
    if a is None:
        return fixed
    return sorted(a.lifetimes.values(), key=lambda lt: (lt.start_s, lt.replica)) + a.cancelled + fixed


def cost_summary(cluster: Cluster, end_s: float, requests: pd.DataFrame) -> dict:
    """The `cost` block of a cluster summary (prices: None where a GPU has no price)."""
    from servesim.simulator.specs.gpu_prices import price_per_gpu_hour

    lives = lifetimes(cluster)
    gpu_hours: dict[str, float] = {}
    for lt in lives:
        until = end_s if lt.end_s is None else min(lt.end_s, end_s)
        gpu_hours[lt.gpu] = gpu_hours.get(lt.gpu, 0.0) + lt.num_gpus * max(until - lt.start_s, 0.0) / 3600.0
    served = requests[requests["first_token_s"].notna()]
    tokens = int(served["prompt_len"].sum() + served["output_len"].sum())
    try:
        usd = sum(h * price_per_gpu_hour(g, cluster.cfg.gpu_cost_per_hour) for g, h in gpu_hours.items())
    except InputError as e:
        usd, note = None, e.detail
    else:
        note = None
    out = {"gpu_hours": sum(gpu_hours.values()), "gpu_hours_by_gpu": gpu_hours, "usd": usd,
           "usd_per_day": None if usd is None or end_s <= 0 else usd * 86400.0 / end_s,
           "usd_per_million_tokens": None if usd is None or tokens == 0 else usd / tokens * 1e6,
           "num_tokens": tokens, "duration_s": end_s,
           "prices_usd_per_gpu_hour": _prices(gpu_hours, cluster.cfg.gpu_cost_per_hour)}
    if note is not None:
        out["note"] = note
    return out


def _prices(gpu_hours: dict[str, float], overrides: dict[str, float]) -> dict[str, float | None]:
    from servesim.simulator.specs.gpu_prices import price_per_gpu_hour

    out: dict[str, float | None] = {}
    for g in gpu_hours:
        try:
            out[g] = price_per_gpu_hour(g, overrides)
        except InputError:
            out[g] = None
    return out


def autoscale_summary(cluster: Cluster, end_s: float) -> dict:
    """The `autoscale` block: counts of events, the fleet's size over time, each replica's life."""
    a = cluster.autoscaler
    events = a.events
    lives = lifetimes(cluster)
    cold = [e["cold_start_s"] for e in events if e["event"] == "cold_start"]
    return {
        "router_proof": _router_proof_note(cluster), "deferred_runs": DEFERRED_DECLINED,
        "interval_s": a.cfg.interval_s, "window_s": a.cfg.window_s,
        "num_decisions": len(a.timeline),
        "num_cold_starts": len(cold), "num_ready": sum(e["event"] == "ready" for e in events),
        "num_cancelled": sum(e["event"] == "cancelled" for e in events),
        "num_drained": sum(e["event"] == "drain" for e in events),
        "num_removed": sum(e["event"] == "removed" for e in events),
        "cold_start_s": cold[0] if cold else None,
        "max_replicas_alive": _max_alive(lives, end_s),
        "pools": [{"group": p.cfg.group, "policy": p.cfg.policy.name, "min_replicas": p.cfg.min_replicas,
                   "max_replicas": p.cfg.max_replicas, "num_ready_at_end": len(p.ready)} for p in a.pools],
    }


def _max_alive(lives: list[Lifetime], end_s: float) -> int:
    edges = sorted([(lt.start_s, 1) for lt in lives] + [(lt.end_s if lt.end_s is not None else end_s, -1)
                                                          for lt in lives], key=lambda e: (e[0], e[1]))
    n = best = 0
    for _, d in edges:
        n += d
        best = max(best, n)
    return best


def lifetimes_frame(cluster: Cluster) -> pd.DataFrame:
    return pd.DataFrame([{"pool": lt.pool, "replica": lt.name, "replica_index": lt.replica, "gpu": lt.gpu,
                          "num_gpus": lt.num_gpus, "start_s": lt.start_s, "ready_s": lt.ready_s,
                          "drain_s": lt.drain_s, "end_s": lt.end_s} for lt in lifetimes(cluster)])


def autoscale_tables(cluster: Cluster) -> dict[str, pd.DataFrame]:
    """The run's autoscaling files: scale_events.csv, scale_timeline.csv (one row per pool and
    decision), replica_lifetimes.csv."""
    a = cluster.autoscaler
    return {"scale_events": pd.DataFrame(a.events), "scale_timeline": pd.DataFrame(a.timeline),
            "replica_lifetimes": lifetimes_frame(cluster)}
