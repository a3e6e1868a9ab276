"""Closed-loop session turns in a cluster (simulator/sessions.py): every replica's finishes release
the turns waiting for them, which go through the router like any arrival.

A turn's arrival is only known once its parent has finished, so no router proof or replica
macro-step can bound it: every replica steps (the reason is in each replica's summary). P/D is
refused: a turn would wait for the decode side's finish, and a request the prefill side never fit
ends without one (a later change can hook Cluster._final).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.simulator.sessions import TURNS_DECLINED, SessionTurns, answer_delay_s, plan_turns
from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster


def attach_turns(cluster: Cluster) -> SessionTurns | None:
    """The cluster's SessionTurns, hooked to every replica's finishes; None without dependent turns."""
    plan = plan_turns(cluster.workload.requests)
    if plan is None:
        return None
    if cluster.cfg.pd is not None:
        raise InputError("closed-loop session turns in a P/D cluster", field="pd",
                         allowed="a cluster without pd, or the turns replayed open-loop (the importers' arrivals option)")
    turns = SessionTurns(cluster.env, plan, cluster.send_turn)
    for r in cluster.replicas:
        r.engine.set_planner(None, TURNS_DECLINED)
        r.engine.on_finish = turns.chain(r.engine.on_finish, answer_delay_s(r.cfg.frontend, r.name))
    return turns
