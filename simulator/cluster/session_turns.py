"""Closed-loop session turns in a cluster (simulator/sessions.py): the cluster's answers release the
turns waiting for them, which go through the gateway (when there is one) and the router like any
arrival.

The answer that releases a turn is the one its client reads (cluster/request_done.py): colocated,
its replica's finish; with P/D, its decode replica's finish. A parent that got no answer (rejected
by the gateway or an engine, timed out, or ended on the prefill side without its first token)
abandons its session's later turns. Each answer reaches its client through the frontend of the
replica that produced it: a constant delay, or the serial loop's delivery.

A turn's arrival is only known once its parent has finished, so no router proof or replica
macro-step can bound it: every replica steps (the reason is in each replica's summary).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.simulator.sessions import SessionTurns, plan_turns

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster


def attach_turns(cluster: Cluster) -> SessionTurns | None:
    """The cluster's SessionTurns, heard by its RequestDone; None without dependent turns."""
    plan = plan_turns(cluster.workload.requests)
    if plan is None:
        return None
    turns = cluster.request_done.turns = SessionTurns(cluster.env, plan, cluster.send_turn)
    return turns
