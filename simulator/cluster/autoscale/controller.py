"""The autoscaler: decides every interval_s, cold-starts replicas, drains them, and keeps the timeline.

Each pool is one replica group. A replica is `starting` from the decision that asked for it until
its cold start (cold_start.py) ends, then `ready` (the router picks among ready replicas only),
then, when a decision removes it, `draining`: the router no longer sees it and its engine is
closed, so it finishes what it holds and its loop ends; that moment it is removed (a P/D replica: at
the first decision that finds it holding nothing, KV awaiting a transfer included). Nothing it
holds is lost or moved. A decision that removes replicas cancels starting ones first (the latest
asked for first), then drains the ready ones holding the fewest requests (the newest on a tie).

Exactness with the fast path: the controller reads replica state at each decision as the router
does at each dispatch, and the candidate set changes only at decisions and when a cold start ends
(together: the next change). Every front replica's announced next arrival is the earlier of the
next change and what the router's proof (simulator/fastpath/router_proofs.py) allows for its
position in the candidate list, rebuilt at each change: a macro-step run ends before any of them,
and what a decision reads is what stepping would show (tests/test_autoscale_timeline.py compares
both). Deferred runs (fastpath/deferred.py) are not used: a decision reads more than the load.

Decisions at k * interval_s (k = 1, 2, ...) until the last request has been dispatched; replicas
still starting then are cancelled (nothing will be routed to them).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import simpy

from servesim.simulator.cluster.autoscale.activator import Activator
from servesim.simulator.cluster.autoscale.behavior import ScaleEvents, rate_limited
from servesim.simulator.cluster.autoscale.cold_start import PHASES, ColdStart, cold_start_of
from servesim.simulator.cluster.autoscale.config import AutoscaleConfig, PoolConfig
from servesim.simulator.cluster.autoscale.cost import Lifetime
from servesim.simulator.cluster.autoscale.policies import AutoscalePolicy, PoolMetrics, make_policy
from servesim.simulator.cluster.autoscale.window import PoolWindow

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster, Replica
    from servesim.simulator.cluster.config import ReplicaGroup


# Routers whose proofs hold when the candidate list changes between decisions: each answer is
# computed from the list as it is when asked. jsq_power_of_two's proof keeps pairs drawn for the
# list's length, so it is not used (its replicas' runs stop at every dispatch, still exact).
PROVED_ROUTERS = frozenset({"round_robin", "least_outstanding", "session_affinity"})


@dataclass(slots=True)
class _Start:
    lifetime: Lifetime
    cold: ColdStart
    ready_at_s: float  # as the clock will read it (the timeout's now + delay)
    cancelled: bool = False


@dataclass(slots=True)
class Pool:
    cfg: PoolConfig
    group: ReplicaGroup
    policy: AutoscalePolicy
    window: PoolWindow
    ready: list[Replica] = field(default_factory=list)
    starting: list[_Start] = field(default_factory=list)
    draining: list[Replica] = field(default_factory=list)
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    scale_events: ScaleEvents = field(default_factory=ScaleEvents)  # for the rate limits (behavior.py)
    num_built: int = 0  # replicas built so far (names: f"{label}{num_built}")


class Autoscaler:
    def __init__(self, cluster: Cluster, cfg: AutoscaleConfig) -> None:
        self.cluster, self.cfg, self.env = cluster, cfg, cluster.env
        slo = cluster.cfg.slo
        labels = {g.name or g.role: g for g in cluster.cfg.replicas}
        first = {}  # label -> index of its first replica (groups are built in order)
        n = 0
        for g in cluster.cfg.replicas:
            first[g.name or g.role] = (n, g.count)
            n += g.count
        self.pools: list[Pool] = []
        self.lifetimes: dict[int, Lifetime] = {}  # by Replica.index
        self.cancelled: list[Lifetime] = []
        for i, pc in enumerate(cfg.pools):
            g = labels[pc.group]
            pool = Pool(pc, g, make_policy(pc.policy.name, pc.policy.params, f"autoscale.pools[{i}].policy", slo),
                        PoolWindow(cfg.window_s, cfg.percentile, slo.ttft_s, slo.tpot_s), num_built=g.count)
            start, count = first[pc.group]
            for r in cluster.replicas[start:start + count]:
                pool.ready.append(r)
                self.lifetimes[r.index] = Lifetime(pc.group, r.name, _gpus(g), g.sim.hardware.gpu, 0.0, 0.0,
                                                   replica=r.index)
            self.pools.append(pool)
        self._pool_of = {r.index: p for p in self.pools for r in p.ready}
        if cluster.cfg.pd is None and not cluster.lockstep_groups and cluster.router.name in PROVED_ROUTERS \
                and any(r.engine.planner is not None for r in cluster.front):
            cluster.use_router_proof_autoscaled()  # the cluster is the fast path's one importer here
        # a pool that may reach zero holds the requests that arrive meanwhile (activator.py)
        self.activator = Activator(self.env, cluster._dispatch) if any(p.min_replicas == 0 for p in cfg.pools) \
            else None
        self.next_decision_s = cfg.interval_s
        self.events: list[dict] = []
        self.timeline: list[dict] = []
        self._num_live = 0
        self._done: simpy.Event | None = None

    # --- the run ---------------------------------------------------------------------------------
    def start(self, indices: list[int], procs: list[simpy.Process]) -> simpy.Event:
        """Start the decision loop beside the engines' loops (procs: those of the replicas
        `indices`, then any lockstep groups'); returns the event that ends the run: every loop,
        including those started later, and the controller done."""
        self._done = self.env.event()
        for k, proc in enumerate(procs):
            self._watch(indices[k] if k < len(indices) else None, proc)
        self._num_live += 1
        self.env.process(self._loop()).callbacks.append(self._one_done)
        return self._done

    def _watch(self, idx: int | None, proc: simpy.Process) -> None:
        self._num_live += 1
        proc.callbacks.append(partial(self._loop_ended, idx))

    def _loop_ended(self, idx: int | None, _ev) -> None:
        life = None if idx is None else self.lifetimes.get(idx)
        if life is not None and life.drain_s is not None:  # a drained replica: removed now
            life.end_s = self.env.now
            pool = self._pool_of[idx]
            pool.draining = [r for r in pool.draining if r.index != idx]
            self._event(pool, "removed", life.name)
        self._one_done(_ev)

    def _one_done(self, _ev) -> None:
        self._num_live -= 1
        if self._num_live == 0 and not self._done.triggered:
            self._done.succeed()

    def _loop(self):
        k = 1
        while True:
            self.next_decision_s = k * self.cfg.interval_s
            self.announce()
            yield self.env.timeout(self.next_decision_s - self.env.now)
            if self.cluster._arrivals_done:
                break
            for pool in self.pools:
                self._decide(pool)
            k += 1
        self.next_decision_s = math.inf
        for pool in self.pools:  # nothing more will be routed: a replica still starting is not needed
            for s in pool.starting:
                self._cancel(pool, s)
            pool.starting = []
        self.announce()

    # --- what the engines are told (the fast path's bound) -----------------------------------------
    def next_change_s(self) -> float:
        """When the candidate set or what is read of it can next change: the next decision or
        the next end of a cold start."""
        t = self.next_decision_s
        for pool in self.pools:
            for s in pool.starting:
                t = min(t, s.ready_at_s)
        return t

    def announce(self) -> None:
        """Each front replica's next arrival (at each dispatch and each change): the router
        proof's bound for its position (none: the next dispatch), capped at the next change."""
        c, change = self.cluster, self.next_change_s()
        bounds = c.arrival_bounds
        i, proof = bounds.next_spec, bounds.proof
        nxt = bounds.dispatch_at(i)
        unread = proof is not None and not proof.reads_all_candidates
        for pos, r in enumerate(c.front):
            t = bounds.dispatch_at(i + proof.arrivals_unread(pos, c.front, c.workload.requests, i)) if unread else nxt
            r.engine.expect_next_arrival(min(t, change))
        for pool in self.pools:
            if pool.group.role != "decode":
                for r in pool.draining:  # nothing is routed here: only the controller reads it
                    r.engine.expect_next_arrival(change)

    def attach_all(self) -> None:
        """Load-bound closures for every front replica, by its position now (positions move
        when the set changes), then the announced arrivals."""
        c = self.cluster
        for pos, r in enumerate(c.front):
            r.engine.expect_arrivals_by_load(partial(self._load_bound, pos))
        for pool in self.pools:
            if pool.group.role != "decode":
                for r in pool.draining:
                    r.engine.expect_arrivals_by_load(lambda _load: self.next_change_s())
        self.announce()

    def _load_bound(self, pos: int, load: int) -> float:
        return min(self.cluster.arrival_bounds.arrival_bound(pos, load), self.next_change_s())

    # --- routing ---------------------------------------------------------------------------------
    def routed(self, replica: Replica, spec) -> None:
        pool = self._pool_of.get(replica.index)
        if pool is not None:
            pool.window.routed(self.env.now, spec.request_id, spec.arrival_time_s, spec.prompt_len,
                               spec.output_len, replica.engine)

    # --- decisions -------------------------------------------------------------------------------
    def _metrics(self, pool: Pool) -> PoolMetrics:
        now = self.env.now
        w = pool.window.sample(now)
        held = len(self.activator.held) if self.activator is not None and pool.group.role != "decode" else 0
        waiting = outstanding = held  # requests held at zero replicas wait for this pool
        kv = 0.0
        for r in pool.ready:
            outstanding += r.engine.num_outstanding
            waiting += r.engine.scheduler.get_request_counts()[1]
            kv += r.engine.kv_usage
        n = len(pool.ready)
        return PoolMetrics(now, pool.group.role, n, len(pool.starting), waiting, outstanding, kv / n if n else 0.0,
                           w.request_rate_per_s, w.mean_prompt_len, w.mean_output_len, w.ttft_s, w.itl_s,
                           w.slo_attainment)

    def _decide(self, pool: Pool) -> None:
        now, pc = self.env.now, pool.cfg
        if pool.group.role != "both":
            self._close_empty_pd(pool)
        m = self._metrics(pool)
        current = len(pool.ready) + len(pool.starting)
        raw = pool.policy.desired(m, current)
        if current == 0 and m.num_waiting:  # KEDA's activation: a pool at zero with demand asks for one
            raw = max(raw, 1)
        stable = _stabilized(pool.recommendations, now, raw, current, pc.scale_up_stabilization_s,
                             pc.scale_down_stabilization_s)
        target = rate_limited(pc, pool.scale_events, now, stable, current)  # and min/max_replicas
        if target > current:
            for _ in range(target - current):
                self._begin_start(pool)
        elif target < current:
            self._remove(pool, current - target)
        self.timeline.append({
            "time_s": now, "pool": pc.group, "num_ready": len(pool.ready), "num_starting": len(pool.starting),
            "num_draining": len(pool.draining), "recommended": raw, "stabilized": stable, "target": target,
            "num_waiting": m.num_waiting, "num_outstanding": m.num_outstanding, "kv_usage": m.kv_usage,
            "request_rate_per_s": m.request_rate_per_s, "ttft_s": m.ttft_s, "itl_s": m.itl_s,
            "slo_attainment": m.slo_attainment})

    def _begin_start(self, pool: Pool) -> None:
        g = pool.group
        name = f"{g.name or g.role}{pool.num_built}"
        pool.num_built += 1
        cold = cold_start_of(pool.cfg.cold_start, g.sim)
        s = _Start(Lifetime(pool.cfg.group, name, _gpus(g), g.sim.hardware.gpu, self.env.now), cold,
                   self.env.now + cold.total_s)
        pool.starting.append(s)
        self._event(pool, "cold_start", name, cold)
        self.env.timeout(cold.total_s).callbacks.append(lambda _ev: self._ready(pool, s))

    def _ready(self, pool: Pool, s: _Start) -> None:
        if s.cancelled:
            return
        pool.starting.remove(s)
        rep = self.cluster.add_replica(pool.group, s.lifetime.name)
        s.lifetime.ready_s, s.lifetime.replica = self.env.now, rep.index
        self.lifetimes[rep.index] = s.lifetime
        self._pool_of[rep.index] = pool
        pool.ready.append(rep)
        candidates = self.cluster.decoders if pool.group.role == "decode" else self.cluster.front
        candidates.append(rep)  # the newest index: index order kept
        self._watch(rep.index, rep.engine.start())
        self.attach_all()
        self._event(pool, "ready", s.lifetime.name)
        if self.activator is not None and candidates is self.cluster.front:
            self.activator.release()  # what waited for a replica goes to it (and to any other ready now)

    def _cancel(self, pool: Pool, s: _Start) -> None:
        s.cancelled = True
        s.lifetime.end_s = self.env.now
        self.cancelled.append(s.lifetime)
        self._event(pool, "cancelled", s.lifetime.name)

    def _remove(self, pool: Pool, n: int) -> None:
        while n and pool.starting:
            self._cancel(pool, pool.starting.pop())
            n -= 1
        victims = sorted(pool.ready, key=lambda r: (r.engine.num_outstanding, -r.index))[:n]
        candidates = self.cluster.decoders if pool.group.role == "decode" else self.cluster.front
        for rep in victims:
            pool.ready.remove(rep)
            candidates.remove(rep)
            pool.draining.append(rep)
            self.lifetimes[rep.index].drain_s = self.env.now
            self._event(pool, "drain", rep.name, num_outstanding=rep.engine.num_outstanding)
            if pool.group.role == "both":
                rep.engine.close()  # it finishes what it holds; its loop's end removes it (_loop_ended)
        self.attach_all()

    def _close_empty_pd(self, pool: Pool) -> None:
        """Close the draining P/D replicas that hold nothing (no request, no KV awaiting a
        transfer): a P/D engine closed earlier would end at its first stall (pd_schedulers.StallGate)
        with a transfer still to come. Their loops end now, so they are removed at this decision."""
        for rep in pool.draining:
            if not rep.engine.scheduler.requests and not rep.engine.in_flight:
                rep.engine.close()

    def _event(self, pool: Pool, kind: str, replica: str, cold: ColdStart | None = None,
               num_outstanding: int | None = None) -> None:
        row = {"time_s": self.env.now, "pool": pool.cfg.group, "event": kind, "replica": replica,
               "num_outstanding": num_outstanding, "cold_start_s": None if cold is None else cold.total_s}
        for p in PHASES:
            row[p] = None if cold is None else getattr(cold, p)
        self.events.append(row)


def _gpus(g: ReplicaGroup) -> int:
    return g.sim.hardware.tp * g.sim.hardware.pp


def _stabilized(recs: deque[tuple[float, int]], now: float, raw: int, current: int, up_s: float,
                down_s: float) -> int:
    """The HPA's stabilization (stabilizeRecommendationWithBehaviors): over the recommendations
    of the last up_s seconds the lowest bounds a scale-up, over the last down_s the highest bounds
    a scale-down; the current recommendation counts in both."""
    recs.append((now, raw))
    horizon = now - max(up_s, down_s)
    while recs and recs[0][0] < horizon:
        recs.popleft()
    up = min(d for t, d in recs if t > now - up_s or t == now)
    down = max(d for t, d in recs if t > now - down_s or t == now)
    return min(max(current, up), down)
