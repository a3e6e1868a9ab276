"""A cluster of simulated engines on one SimPy clock: routers, and optionally P/D disaggregation.

    res = Cluster(ClusterConfig(...), workload).run()
    res.summary, res.requests (one row per request, with the replica), res.replicas[i].result

One arrival process reads the workload; each request reaches the router `routing_latency_s` after
it arrives, and the router's pick receives it in that same instant. Each replica is a full
`Engine` (its own scheduler, executor and cost model, from its own SimConfig).

The cluster owns its replicas, routers, links and routes, and small objects with their own state:
`ArrivalBounds` (arrival_bounds.py: when a request can next reach each front replica, what their
planners are told) and, with P/D (cfg.pd set), `PDHandoffs` (pd_handoffs.py: each request from its
prefill replica through the hand-off and the KV transfer to its decode replica).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from servesim.simulator.cluster.arrival_bounds import ArrivalBounds
from servesim.simulator.cluster.config import ClusterConfig, ReplicaGroup
from servesim.simulator.cluster.host_memory import check_node_memory
from servesim.simulator.cluster.link import KVLink
from servesim.simulator.cluster.pd import DecodeEngine, PrefillEngine, RemotePrefillConnector
from servesim.simulator.cluster.pd_handoffs import PDHandoffs
from servesim.simulator.cluster.pd_links import PDLinks
from servesim.simulator.cluster.request_done import RequestDone
from servesim.simulator.cluster.routers import Decision, make_router
from servesim.simulator.cluster.session_turns import attach_turns
from servesim.simulator.collector import collector_paused
from servesim.simulator.config import SimConfig
from servesim.simulator.build import attach_planner
from servesim.simulator.engine import Engine
from servesim.simulator.gateway.wiring import attach_to_cluster
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


@dataclass(slots=True)
class Replica:
    index: int  # position in Cluster.replicas (the `replica` column)
    name: str  # e.g. "both0", "prefill1", or f"{group name}{i}"
    role: str  # "both" | "prefill" | "decode"
    cfg: SimConfig
    engine: Engine
    num_routed: int = 0  # requests the router sent here
    node: str | None = None  # the machine it runs on (ReplicaGroup.node; None: its own)


@dataclass(slots=True)
class RouteRecord:
    replica: int  # Replica.index
    time_s: float  # when the router decided (= when the replica received the request)
    reason: str
    score: float | None


class Cluster:
    def __init__(self, cfg: ClusterConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.workload = workload
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(cfg.seed)  # the run's one Generator, shared by the routers
        self._specs = {s.request_id: s for s in workload.requests}
        if len(self._specs) != len(workload.requests):
            raise InputError("the workload has duplicate request ids", field="request_id",
                             allowed="unique ids (a cluster merges results by id)")
        mm = next((s.request_id for s in workload.requests if s.mm_items), None)
        if mm is not None:  # routers, P/D hand-offs and replica fast paths know nothing of encoder inputs
            raise InputError(f"request {mm!r} has multimodal items; a cluster does not run multimodal requests",
                             field="mm_items", allowed="a single engine (servesim run / replay) for multimodal traffic")
        # The P/D replicas' callbacks are its methods: it exists before them (connected below).
        self.handoffs = PDHandoffs(self.env, cfg) if cfg.pd is not None else None
        self.replicas = self._build_replicas()
        check_node_memory(self.replicas)  # the CPU KV tiers on each node fit its host memory
        # Who hears that the cluster is done with a request: the gateway and the turns (request_done.py).
        self.request_done = RequestDone(self)
        # Closed-loop session turns, dispatched after their parent's answer (simulator/sessions.py;
        # None without any); the arrival process below reads the others, in workload order.
        self.turns = attach_turns(self)
        self._open_loop = workload.requests if self.turns is None else self.turns.first_requests
        self.router = make_router(cfg.router.name, cfg.router.params, self.rng, "router")
        self.routes: dict[str, RouteRecord] = {}
        self.front = [r for r in self.replicas if r.role != "decode"]  # what the main router picks from
        self.decoders = [r for r in self.replicas if r.role == "decode"]
        self.links: list[KVLink] = []
        if cfg.pd is not None:
            self.decode_router = make_router(cfg.pd.decode_router.name, cfg.pd.decode_router.params, self.rng,
                                             "pd.decode_router")
            self.pd_links = PDLinks(self.env, cfg.pd, self.decoders)  # network and intra-node links
            self.links = self.pd_links.links
            self.handoffs.connect(self)
        # Admission and flow control before the router (simulator/gateway/), or None.
        self.gateway = attach_to_cluster(self, self._dispatch)
        self.request_done.hook_all()
        self._arrivals_done = False
        latency = cfg.routing_latency_s
        self.arrival_bounds = ArrivalBounds([s.arrival_time_s + latency for s in self._open_loop],  # as _arrivals adds
                                            self.front, workload.requests)
        self.autoscaler = None  # simulator/cluster/autoscale/: replicas come and go; its bound replaces the proofs
        self.activator = None  # holds requests while a pool scaled to zero has no replica (autoscale/activator.py)
        if cfg.autoscale is not None:
            from servesim.simulator.cluster.autoscale.controller import Autoscaler

            self.autoscaler = Autoscaler(self, cfg.autoscale)
            self.activator = self.autoscaler.activator
            self.autoscaler.attach_all()
        elif cfg.pd is None and not self.lockstep_groups and any(r.engine.planner is not None for r in self.front):
            # Replicas with planners behind one router, whose runs may go past arrivals that the
            # router provably sends elsewhere (a P/D handoff or a lockstep group has other readers).
            self._use_router_proof()
        if cfg.pd is not None:
            self._use_pd_bounds()  # decode replicas' runs end before the next hand-off or landing

    def _use_pd_bounds(self) -> None:
        """The P/D decode replicas' outside-event bounds, or their planners declined with the reason
        (simulator/fastpath/pd_runs.py, imported only where a decode replica has a planner)."""
        if any(r.engine.planner is not None for r in self.decoders):
            from servesim.simulator.fastpath.pd_runs import attach_pd_bounds

            attach_pd_bounds(self)

    def _use_router_proof(self) -> None:
        """Hand each front replica the router's proof of when a request can next reach it
        (ArrivalBounds.use_proof). The proofs are the fast path's (simulator/fastpath/), imported
        only here: a cluster whose replicas step one by one needs none."""
        from servesim.simulator.fastpath.router_proofs import proof_for

        self.arrival_bounds.use_proof(proof_for(self.router))

    def use_router_proof_autoscaled(self) -> None:
        """The router's proof for an autoscaled cluster, whose controller asks it at each dispatch and
        change of the candidate set (autoscale/controller.py: no deferred runs)."""
        from servesim.simulator.fastpath.router_proofs import proof_for

        self.arrival_bounds.proof = proof_for(self.router)

    def _build_replicas(self) -> list[Replica]:
        # Built with the collector paused (as run_cluster builds the whole cluster): each replica's
        # KV pool adds ~28 k block objects, and full collections walked all the pools built so far
        # (0.54-0.62 s of a 32-replica build, 0.09 s without).
        with collector_paused():
            return self._build_replica_list()

    def _build_replica_list(self) -> list[Replica]:
        out: list[Replica] = []
        self.lockstep_groups: list[list[int]] = []  # replica indices of each lockstep (DP) group
        for group in self.cfg.replicas:
            if group.lockstep:
                self.lockstep_groups.append(list(range(len(out), len(out) + group.count)))
            for i in range(group.count):
                out.append(self._make_replica(group, len(out), f"{group.name or group.role}{i}"))
        names = [r.name for r in out]
        if len(set(names)) != len(names):
            raise InputError("replica names collide", field="replicas[].name", allowed="distinct group names")
        return out

    def _make_replica(self, group: ReplicaGroup, idx: int, name: str) -> Replica:
        kw = dict(env=self.env, name=name)
        if group.role == "prefill":
            engine = PrefillEngine(group.sim, on_finish=partial(self.handoffs.on_prefill_finish, idx), **kw)
        elif group.role == "decode":
            conn = RemotePrefillConnector(partial(self.handoffs.start_transfer, idx))
            engine = DecodeEngine(group.sim, connector=conn, on_finish=partial(self.handoffs.on_decode_finish, idx), **kw)
        else:
            engine = Engine(group.sim, **kw)
        return Replica(idx, name, group.role, group.sim, attach_planner(engine), node=group.node)

    def add_replica(self, group: ReplicaGroup, name: str) -> Replica:
        """A replica of `group` built mid-run (the autoscaler's, once its cold start is over)."""
        with collector_paused():
            rep = self._make_replica(group, len(self.replicas), name)
        self.replicas.append(rep)
        if rep.role == "decode":
            self.pd_links.add_decoder(rep)
            self._use_pd_bounds()  # autoscaled: declined
        self.request_done.hook(rep)
        return rep

    # --- arrivals and routing --------------------------------------------------------------------
    def _arrivals(self):
        env, bounds, requests = self.env, self.arrival_bounds, self._open_loop
        dispatch_s = bounds.dispatch_s
        for i, spec in enumerate(requests):
            bounds.next_spec = i
            t = dispatch_s[i]  # constant latency keeps arrival order: a delay line
            if t > env.now:
                self._announce_next_arrival(i)
                yield env.timeout(t - env.now)
            self._admit(spec)
        if self.turns is not None:  # the turns go through the gateway too: they are all sent first
            yield from self.turns.wait_all_sent()
        if self.gateway is not None:  # what it still holds is dispatched or rejected first
            yield self.gateway.drained()
        if self.activator is not None:  # held for a pool at zero: routed when a replica is ready
            yield from self.activator.wait_empty()
        bounds.next_spec = len(requests)
        self._announce_next_arrival(len(requests))
        self._arrivals_done = True
        if self.cfg.pd is None:
            for r in self.replicas:
                r.engine.close()
        else:
            self.handoffs.arrivals_done()

    def _announce_next_arrival(self, i: int) -> None:
        """Request i is the next to be dispatched (all before it were): tell the front replicas when
        their next arrival can come (ArrivalBounds.announce; an autoscaler's bound replaces it)."""
        if self.autoscaler is not None:
            self.autoscaler.announce()
            return
        self.arrival_bounds.announce(i)

    def send_turn(self, spec: RequestSpec):
        """A session turn its client sends now reaches the router routing_latency_s later (a generator)."""
        if self.cfg.routing_latency_s > 0:
            yield self.env.timeout(self.cfg.routing_latency_s)
        self._specs[spec.request_id] = spec  # as sent: its arrival_time_s is the send time
        self._admit(spec)

    def _admit(self, spec: RequestSpec) -> None:
        """A request its client sent at spec.arrival_time_s reaches the router now: through the gateway when there is one."""
        if self.gateway is None:
            self._dispatch(spec)
        else:
            self.gateway.offer(spec, spec.arrival_time_s)

    def sent_requests(self) -> list[RequestSpec]:
        """The requests as they were sent, in workload order: a session turn at its send time, a turn
        never sent (its session ended without an answer) left out."""
        if self.turns is None:
            return self.workload.requests
        return [self._specs[s.request_id] for s in self.workload.requests if s.request_id not in self.turns.abandoned]

    def _route(self, router, spec: RequestSpec, candidates: list[Replica]) -> tuple[Replica, RouteRecord]:
        d: Decision = router.choose(spec, candidates, self.env.now)
        rep = candidates[d.candidate]
        rep.num_routed += 1
        if self.autoscaler is not None:
            self.autoscaler.routed(rep, spec)
        return rep, RouteRecord(rep.index, self.env.now, d.reason, d.score)

    def _dispatch(self, spec: RequestSpec) -> None:
        if not self.front and self.activator is not None:  # the pool is at zero: held until a replica is ready
            self.activator.hold(spec)
            return
        rep, rec = self._route(self.router, spec, self.front)
        self.routes[spec.request_id] = rec
        if self.cfg.pd is None:
            rep.engine.submit(spec)
            return
        self.handoffs.dispatch(rep, spec)

    # --- run -------------------------------------------------------------------------------------
    def _raise_stall(self) -> None:
        """SimPy ran out of events with replicas still waiting: no arrival, handoff, transfer or
        pin expiry is left that could wake them. Name the replica and its stuck requests."""
        pending = len(self.workload.requests) - sum(r.engine.num_done for r in self.replicas) \
            - (len(self.gateway.rejected) + len(self.gateway.gone) if self.gateway is not None else 0) \
            if self.cfg.pd is None else len(self.routes) - self.handoffs.num_final
        _stuck_replica(self.replicas).engine.ends.raise_stall(
            f"the cluster is idle with {pending} request(s) unfinished and nothing left that could wake it "
            "(no arrival, handoff, KV transfer or pin expiry)")

    def run(self):
        """Simulate to the end; returns a ClusterResult."""
        with collector_paused():
            return self._run()

    def _run(self):
        from servesim.simulator.cluster.results import build_result

        t0 = time.perf_counter()
        self.env.process(self._arrivals())  # before the engine loops, as Engine.run orders them
        grouped = {i for g in self.lockstep_groups for i in g}
        procs = [r.engine.start() for r in self.replicas if r.index not in grouped]
        if self.lockstep_groups:
            from servesim.simulator.cluster.dp import LockstepGroup

            self.lockstep = [LockstepGroup([self.replicas[i].engine for i in g]) for g in self.lockstep_groups]
            procs += [g.start() for g in self.lockstep]
        done = self.env.all_of(procs) if self.autoscaler is None else \
            self.autoscaler.start([r.index for r in self.replicas if r.index not in grouped], procs)
        try:
            self.env.run(until=done)
        except RuntimeError:
            if done.triggered:
                raise
            self._raise_stall()
        return build_result(self, time.perf_counter() - t0)


def _stuck_replica(replicas: list[Replica]) -> Replica:
    """The replica holding the most unfinished requests (the one to diagnose)."""
    def unfinished(r: Replica) -> int:
        return sum(not q.is_finished() for q in r.engine.scheduler.requests.values())
    return max(replicas, key=unfinished)


def run_cluster(cfg: ClusterConfig, workload: Workload):
    """Build and run a cluster (the Python API's one call)."""
    with collector_paused():
        return Cluster(cfg, workload).run()
