"""A cluster of simulated engines on one SimPy clock: routers, and optionally P/D disaggregation.

    res = Cluster(ClusterConfig(...), workload).run()
    res.summary, res.requests (one row per request, with the replica), res.replicas[i].result

One arrival process reads the workload; each request reaches the router `routing_latency_s` after
it arrives, and the router's pick receives it in that same instant. Each replica is a full
`Engine` (its own scheduler, executor and cost model, from its own SimConfig).

With P/D (cfg.pd set) the router picks a prefill replica, which runs the prompt and one token
(output_len=1) and keeps the KV; `handoff_latency_s` later the decode router picks a decode
replica, whose scheduler reserves blocks for the prompt (WAITING_FOR_REMOTE_KVS) and thereby starts
the transfer on its link; when the transfer lands the prefill side frees its blocks and the decode
side recomputes the last prompt token and generates the full output_len tokens.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import simpy

from servesim.scheduler.request import Request
from servesim.simulator.cluster.config import ClusterConfig, ReplicaGroup
from servesim.simulator.cluster.host_memory import check_node_memory
from servesim.simulator.cluster.link import KVLink
from servesim.simulator.cluster.pd import DecodeEngine, PrefillEngine, RemotePrefillConnector
from servesim.simulator.cluster.pd_links import PDLinks
from servesim.simulator.cluster.request_done import RequestDone
from servesim.simulator.cluster.routers import Decision, make_router
from servesim.simulator.cluster.session_turns import attach_turns
from servesim.simulator.collector import collector_paused
from servesim.simulator.config import SimConfig
from servesim.simulator.build import attach_planner
from servesim.simulator.engine import Engine
from servesim.simulator.gateway.wiring import attach_to_cluster
from servesim.simulator.specs import resolve_model
from servesim.simulator.specs.pipeline_stages import stage_kv_bytes_per_token
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload

if TYPE_CHECKING:  # the fast path's contract; imported at run time only where proofs are wanted
    from servesim.simulator.fastpath.router_proofs import RouterProof


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


@dataclass(slots=True)
class PDTimeline:
    """One request's P/D milestones (seconds on the cluster clock)."""

    prefill_done_s: float | None = None  # the prefill replica produced its token and kept the KV
    decode: RouteRecord | None = None
    transfer_start_s: float | None = None  # decode side reserved blocks; the transfer began
    transfer_end_s: float | None = None  # the last byte landed
    external_tokens: int = 0  # tokens whose KV crossed the link (prompt minus decode-side cache hits)
    kv_bytes: int = 0  # bytes on the link (per GPU: each TP rank sends its shard in parallel)


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
        self.timelines: dict[str, PDTimeline] = {}
        self.links: list[KVLink] = []
        self.pending_handoffs_s: list[float] = []  # a heap: when hand-offs now pending land (fastpath/pd_runs.py)
        if cfg.pd is not None:
            self.decode_router = make_router(cfg.pd.decode_router.name, cfg.pd.decode_router.params, self.rng,
                                             "pd.decode_router")
            self.pd_links = PDLinks(self.env, cfg.pd, self.decoders)  # network and intra-node links
            self.links = self.pd_links.links
            self._kv_bytes = self._kv_bytes_table()
        # Admission and flow control before the router (simulator/gateway/), or None.
        self.gateway = attach_to_cluster(self, self._dispatch)
        self.request_done.hook_all()
        self._arrivals_done = False
        self._num_final = 0
        self._next_spec = 0  # index in workload.requests of the next request to dispatch
        latency = cfg.routing_latency_s
        self._dispatch_s = [s.arrival_time_s + latency for s in self._open_loop]  # as _arrivals adds
        self._landing_s = _landing_times(self._dispatch_s)  # where SimPy's clock reads each dispatch
        self._landing_set = frozenset(self._landing_s)
        # The router's proof (None: none, or not asked for) and, when it proves that decisions read
        # only some replicas (_announce_next_arrival), per front replica: (index of the first
        # decision that may pick or read it, its position in front), a heap.
        self._proof: RouterProof | None = None
        self._unread_until: list[tuple[int, int]] | None = None
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
        """Hand each front replica the router's proof of when a request can next reach it. The
        proofs are the fast path's (simulator/fastpath/), imported only here: a cluster whose
        replicas step one by one needs none. Without a proof for this router each replica's bound
        is the next dispatch, whoever it goes to (still exact)."""
        from servesim.simulator.fastpath.router_proofs import proof_for

        proof = self._proof = proof_for(self.router)
        dispatch_sorted = all(a <= b for a, b in zip(self._dispatch_s, self._dispatch_s[1:]))
        for pos, r in enumerate(self.front):
            r.engine.expect_arrivals_by_load(partial(self._arrival_bound, pos))
            if proof is not None and (proof.reads_only_load or proof.reads_planned_state) and dispatch_sorted:
                r.engine.defer_runs(self._first_dispatch_at, reads_state=not proof.reads_only_load)
        if proof is not None and not proof.reads_all_candidates:
            self._unread_until = [(-1, pos) for pos in range(len(self.front))]

    def use_router_proof_autoscaled(self) -> None:
        """The router's proof for an autoscaled cluster, whose controller asks it at each dispatch and
        change of the candidate set (autoscale/controller.py: no deferred runs)."""
        from servesim.simulator.fastpath.router_proofs import proof_for

        self._proof = proof_for(self.router)

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
            engine = PrefillEngine(group.sim, on_finish=partial(self._on_prefill_finish, idx), **kw)
        elif group.role == "decode":
            conn = RemotePrefillConnector(partial(self._start_transfer, idx))
            engine = DecodeEngine(group.sim, connector=conn, on_finish=partial(self._on_decode_finish, idx), **kw)
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

    def _kv_bytes_table(self) -> dict[tuple[tuple[int, int], tuple[int, int]], int]:
        """Bytes per token on the link for each (prefill, decode) (tp, pp) pair: the larger per-GPU
        shard, since ranks send in parallel and the side with fewer ranks holds more per GPU (with
        pipeline stages, a GPU holds its stage's layers only; the stage with the most bounds)."""
        model = resolve_model(self.replicas[0].cfg.hardware.model)
        layouts = {(r.cfg.hardware.tp, r.cfg.hardware.pp) for r in self.replicas}
        per_gpu = {(tp, pp): max(stage_kv_bytes_per_token(model, tp, pp)) for tp, pp in layouts}
        return {(p, d): max(per_gpu[p], per_gpu[d]) for p in layouts for d in layouts}

    # --- arrivals and routing --------------------------------------------------------------------
    def _arrivals(self):
        env, dispatch_s, requests = self.env, self._dispatch_s, self._open_loop
        for i, spec in enumerate(requests):
            self._next_spec = i
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
        self._next_spec = len(requests)
        self._announce_next_arrival(len(requests))
        self._arrivals_done = True
        if self.cfg.pd is None:
            for r in self.replicas:
                r.engine.close()
        else:
            self._maybe_close_pd()

    def _announce_next_arrival(self, i: int) -> None:
        """Tell each front replica when its next arrival can come (request i is the next to be
        dispatched; all before it were): what lets a replica's macro-steps run, as Engine._arrivals
        tells its own engine. The first decision that may pick a replica or read its state bounds
        it: with a router that reads every replica that is request i's, for every replica; with
        one that reads only some, each replica's own, which stays valid until that decision is
        made (RouterProof.arrivals_unread), so only the replicas whose decision was made are asked again."""
        heap, proof = self._unread_until, self._proof
        if self.autoscaler is not None:
            self.autoscaler.announce()
            return
        if heap is None or proof is None:
            t = self._dispatch_at(i)
            for r in self.front:
                r.engine.expect_next_arrival(t)
            return
        specs = self.workload.requests
        while heap and heap[0][0] < i:
            pos = heap[0][1]
            until = i + proof.arrivals_unread(pos, self.front, specs, i)
            heapq.heapreplace(heap, (until, pos))
            self.front[pos].engine.expect_next_arrival(self._dispatch_at(until))

    def _dispatch_at(self, i: int) -> float:
        """When request i reaches the router (never, past the last)."""
        return self._landing_s[i] if i < len(self._landing_s) else float("inf")

    def _first_dispatch_at(self, times: Sequence[float]) -> int:
        """Index of the first of `times` at which a request reaches the router (len(times) if
        none): a deferred run must end before it (simulator/fastpath/deferred.py). Exact: the clock's
        reading at each dispatch is known in advance (_landing_times)."""
        at = self._landing_set
        if at.isdisjoint(times):  # the usual answer, in one C loop
            return len(times)
        return next((i for i, t in enumerate(times) if t in at), len(times))

    def _arrival_bound(self, pos: int, load: int) -> float:
        """The earliest time a request can reach front replica `pos` while its load stays >= load:
        the dispatch time of the first request the router's proof cannot show goes elsewhere (the
        next one, without a proof)."""
        i, proof = self._next_spec, self._proof
        if proof is None:
            return self._dispatch_at(i)
        return self._dispatch_at(i + proof.arrivals_elsewhere(pos, load, self.front, self.workload.requests, i))

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
        self.timelines[spec.request_id] = PDTimeline()
        self._specs[spec.request_id] = spec  # as dispatched (the gateway's priority): the decode side's too
        rep.engine.submit(replace(spec, output_len=1))  # prefill plus the first token

    # --- completion callbacks (called from inside an engine's step) ------------------------------
    def _on_prefill_finish(self, idx: int, request_id: str, reason: str | None) -> None:
        tl = self.timelines[request_id]
        tl.prefill_done_s = self.env.now
        if not self.replicas[idx].engine.metrics.requests[request_id].token_times_s:
            self._final(idx, request_id, reason)  # never fit on the prefill replica (or its client gave up): no decode
            return
        delay = self.cfg.pd.handoff_latency_s
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _ev: self._handoff(request_id))
            heapq.heappush(self.pending_handoffs_s, self.env.now + delay)  # the timeout's own time
        else:
            self._handoff(request_id)

    def _handoff(self, request_id: str) -> None:
        spec = self._specs[request_id]
        rep, rec = self._route(self.decode_router, spec, self.decoders)
        self.timelines[request_id].decode = rec
        rep.engine.connector.expect(request_id)
        rep.engine.submit_handed_over(spec, self.replicas[self.routes[request_id].replica].engine)

    def _start_transfer(self, decode_idx: int, request: Request, num_external: int) -> None:
        rid = request.request_id
        tl = self.timelines[rid]
        tl.transfer_start_s = self.env.now
        tl.external_tokens = num_external
        prefill, decode = self.replicas[self.routes[rid].replica], self.replicas[decode_idx]
        p_hw, d_hw = prefill.cfg.hardware, decode.cfg.hardware
        tl.kv_bytes = num_external * self._kv_bytes[((p_hw.tp, p_hw.pp), (d_hw.tp, d_hw.pp))]
        self.pd_links.link_for(prefill, decode).transfer(tl.kv_bytes, partial(self._transfer_done, rid, decode_idx))

    def _transfer_done(self, request_id: str, decode_idx: int) -> None:
        self.timelines[request_id].transfer_end_s = self.env.now
        self.replicas[self.routes[request_id].replica].engine.kv_sent(request_id)
        self.replicas[decode_idx].engine.kv_received(request_id)

    def _on_decode_finish(self, idx: int, request_id: str, reason: str | None) -> None:
        if self.timelines[request_id].transfer_start_s is None:
            # Never fit on the decode replica: nobody will read the prefill side's KV.
            self.replicas[idx].engine.connector.forget(request_id)
            self.replicas[self.routes[request_id].replica].engine.kv_sent(request_id)
        self._final(idx, request_id, reason)

    def _final(self, idx: int, request_id: str, reason: str | None) -> None:
        """Replica idx ended a P/D request for good: the cluster is done with it."""
        self._num_final += 1
        if self.request_done.hooked:
            self.request_done.done(idx, request_id, reason)
        self._maybe_close_pd()

    def _maybe_close_pd(self) -> None:
        # P/D engines stay open until every request is done: a handoff or a transfer can come at any
        # time, and a stalled engine that was closed would stop (pd_schedulers.StallGate).
        # Once arrivals are done every request that will reach the router has (the gateway and the
        # turns settled first): each routed request ends in exactly one _final.
        if self._arrivals_done and self._num_final == len(self.routes):
            for r in self.replicas:
                r.engine.close()

    # --- run -------------------------------------------------------------------------------------
    def _raise_stall(self) -> None:
        """SimPy ran out of events with replicas still waiting: no arrival, handoff, transfer or
        pin expiry is left that could wake them. Name the replica and its stuck requests."""
        pending = len(self.workload.requests) - sum(r.engine.num_done for r in self.replicas) \
            - (len(self.gateway.rejected) + len(self.gateway.gone) if self.gateway is not None else 0) \
            if self.cfg.pd is None else len(self.routes) - self._num_final
        _stuck_replica(self.replicas).engine.raise_stall(
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


def _landing_times(dispatch_s: list[float]) -> list[float]:
    """The clock at each dispatch as Cluster._arrivals reaches it: a timeout of (t - now) from
    the previous one lands at now + (t - now), which can differ from t in the last bit; a time
    already passed dispatches at once."""
    out, now = [], 0.0
    for t in dispatch_s:
        if t > now:
            now = now + (t - now)
        out.append(now)
    return out


def _stuck_replica(replicas: list[Replica]) -> Replica:
    """The replica holding the most unfinished requests (the one to diagnose)."""
    def unfinished(r: Replica) -> int:
        return sum(not q.is_finished() for q in r.engine.scheduler.requests.values())
    return max(replicas, key=unfinished)


def run_cluster(cfg: ClusterConfig, workload: Workload):
    """Build and run a cluster (the Python API's one call)."""
    with collector_paused():
        return Cluster(cfg, workload).run()
