"""Where the gateway plugs in: in front of one engine's frontend (a replay), or in front of a
cluster's router. The hooks in simulator/client.py, simulator/engine.py and
simulator/cluster/cluster.py are one call each into this module.

A rejected request is recorded like any request the server refused (status 'rejected', its
reason in reject_reason): on the engine for a replay, in the cluster's merged requests for a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from servesim.simulator.gateway.gateway import Gateway, warn_unmapped_priority
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster
    from servesim.simulator.engine import Engine

GATEWAY_DECLINED = ("the gateway (admission, queuing, flow control): its dispatches depend on when "
                    "requests finish")


def attach_to_engine(engine: Engine) -> Gateway | None:
    """The replay's gateway between its clients and its frontend (None when off)."""
    cfg = engine.cfg.gateway
    if not cfg.enabled:
        return None
    warn_unmapped_priority(cfg, engine.cfg.scheduler.policy)

    def reject(spec: RequestSpec, sent_s: float, reason: str) -> None:
        engine.metrics.on_arrival(spec.request_id, sent_s, spec.prompt_len, spec.output_len)
        engine.ends.rejected(spec.request_id, reason)

    if engine.workload is None:  # its owner submits (a closed loop, a cluster): not through the clients
        raise InputError("the gateway runs in front of a replay's clients; this engine's owner submits its "
                         "requests itself (a closed loop, or a cluster replica)", field="gateway.enabled",
                         allowed="false here (a cluster's gateway is its top-level `gateway:`)")
    def gone(spec: RequestSpec, sent_s: float) -> None:
        engine.metrics.on_arrival(spec.request_id, sent_s, spec.prompt_len, spec.output_len)
        engine.ends.gone(spec.request_id)

    gateway = Gateway(engine.env, cfg, engine.clients.forward, reject, gone, engine.cfg.client.timeout_s)
    engine.clients.gateway = gateway
    turns_heard = engine.on_finish  # closed-loop session turns (simulator/sessions.py), or None

    def done(request_id: str, reason: str | None) -> None:
        if turns_heard is not None:  # first, as in a cluster (cluster/request_done.py)
            turns_heard(request_id, reason)
        gateway.done(request_id)

    engine.on_finish = gateway.done if turns_heard is None else done
    return gateway


def attach_to_cluster(cluster: Cluster, dispatch: Callable[[RequestSpec], None]) -> Gateway | None:
    """The cluster's gateway between its arrivals and its router (None when off): `dispatch` routes
    a request (to a replica, or with P/D to a prefill replica). Its rejections, and the requests whose
    clients gave up while queued, never reach a replica: the gateway keeps them (`Gateway.rejected`,
    `Gateway.gone`), and the cluster's results give each a row of its own. A slot frees when the
    cluster is done with a request (cluster/request_done.py: with P/D, its decode side's end)."""
    cfg = cluster.cfg.gateway
    if not cfg.enabled:
        return None
    # The clients' timeout where the front replicas agree on one (a request's own timeout_s wins).
    timeouts = {r.cfg.client.timeout_s for r in cluster.front}
    done = cluster.request_done
    gateway = Gateway(cluster.env, cfg, lambda spec, _sent_s: dispatch(spec),
                      lambda spec, _sent_s, _reason: done.refused(spec.request_id, None),
                      lambda spec, _sent_s: done.refused(spec.request_id, "abort"),
                      timeouts.pop() if len(timeouts) == 1 else None)
    for policy in sorted({r.cfg.scheduler.policy for r in cluster.replicas}):
        warn_unmapped_priority(cfg, policy)
    done.gateway = gateway
    return gateway
