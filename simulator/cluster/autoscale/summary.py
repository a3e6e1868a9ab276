"""An autoscaled run's summary block and files (the cluster's results.py asks for them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from servesim.simulator.cluster.autoscale.controller import PROVED_ROUTERS
from servesim.simulator.cluster.autoscale.cost import Lifetime, lifetimes

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster

# What the fast path does under autoscaling (controller.py), stated in the summary.
DEFERRED_DECLINED = "deferred runs declined: a decision reads KV usage and queues, not only the load"


def _router_proof_note(cluster: Cluster) -> str:
    if cluster.arrival_bounds.proof is not None:
        return (f"{cluster.router.name}'s proof, rebuilt at each change of the candidate set; runs stop at the next "
                "decision or cold-start end")
    why = "not proved exact when the candidate set changes" if cluster.router.name not in PROVED_ROUTERS \
        else "no replica runs macro-steps" if cluster.cfg.pd is None else "P/D"
    return f"declined ({why}): runs stop at every dispatch and decision"


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
        "activator": None if a.activator is None else a.activator.summary(),  # scale to zero's held requests
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
