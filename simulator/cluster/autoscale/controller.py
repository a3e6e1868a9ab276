"""The autoscaler: decides every interval_s, cold-starts replicas, drains them, and keeps the timeline.

Each pool is one replica group. A replica is `starting` from the decision that asked for it until
its cold start (cold_start.py) ends, then `ready` (the router picks among ready replicas only),
then, when a decision removes it, `draining`: the router no longer sees it and its engine is
closed, so it finishes what it holds and its loop ends; that moment it is removed. Nothing it
holds is lost or moved. A decision that removes replicas cancels starting ones first (the latest
asked for first), then drains the ready ones holding the fewest requests (the newest on a tie).

Exactness with the fast path: the controller reads replica state at each decision as the router
does at each dispatch, so every front replica's announced next arrival is the earlier of the next
dispatch and the next decision (`bound`): a macro-step run ends before either, and what a
decision reads is what stepping would show (tests/test_autoscale_exact.py compares both).

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

from servesim.simulator.cluster.autoscale.cold_start import PHASES, ColdStart, cold_start_of
from servesim.simulator.cluster.autoscale.config import AutoscaleConfig, PoolConfig
from servesim.simulator.cluster.autoscale.policies import AutoscalePolicy, PoolMetrics, make_policy
from servesim.simulator.cluster.autoscale.window import PoolWindow

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster, Replica
    from servesim.simulator.cluster.config import ReplicaGroup


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


@dataclass(slots=True)
class _Start:
    lifetime: Lifetime
    cold: ColdStart
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
        self.next_decision_s = cfg.interval_s
        self.events: list[dict] = []
        self.timeline: list[dict] = []
        self._procs: dict[int, simpy.Process] = {}
        self._num_live = 0
        self._done: simpy.Event | None = None

    # --- the run ---------------------------------------------------------------------------------
    def start(self, procs: dict[int, simpy.Process]) -> simpy.Event:
        """Start the decision loop beside the engines' loops (by replica index); returns the event
        that ends the run: every engine loop, including those started later, and the controller done."""
        self._done = self.env.event()
        for idx, proc in procs.items():
            self._watch(idx, proc)
        self._num_live += 1
        self.env.process(self._loop()).callbacks.append(self._one_done)
        return self._done

    def _watch(self, idx: int, proc: simpy.Process) -> None:
        self._procs[idx] = proc
        self._num_live += 1
        proc.callbacks.append(partial(self._loop_ended, idx))

    def _loop_ended(self, idx: int, _ev) -> None:
        life = self.lifetimes.get(idx)
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

    # --- what the engines are told (the fast path's bound) -----------------------------------------
    def bound(self) -> float:
        """The earliest time anything outside reads or sends to a front replica: the next
        dispatch or the next decision."""
        c = self.cluster
        return min(c._dispatch_at(c._next_spec), self.next_decision_s)

    def announce(self) -> None:
        t = self.bound()
        for r in self._front_engines():
            r.engine.expect_next_arrival(t)

    def _front_engines(self):
        for pool in self.pools:
            if pool.group.role != "decode":
                yield from pool.ready
                yield from pool.draining
        for r in self.cluster.front:  # groups not autoscaled
            if r.index not in self._pool_of:
                yield r

    def attach(self, replica: Replica) -> None:
        """Give a front replica's planner the bound (also what keeps its runs short of a decision)."""
        if replica.role != "decode":
            replica.engine.expect_arrivals_by_load(lambda _load: self.bound())
            replica.engine.expect_next_arrival(self.bound())

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
        waiting = outstanding = 0
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
        m = self._metrics(pool)
        current = len(pool.ready) + len(pool.starting)
        raw = pool.policy.desired(m, current)
        target = _stabilized(pool.recommendations, now, raw, current, pc.scale_up_stabilization_s,
                             pc.scale_down_stabilization_s)
        target = min(max(target, pc.min_replicas), pc.max_replicas)
        if target > current:
            for _ in range(target - current):
                self._begin_start(pool)
        elif target < current:
            self._remove(pool, current - target)
        self.timeline.append({
            "time_s": now, "pool": pc.group, "num_ready": len(pool.ready), "num_starting": len(pool.starting),
            "num_draining": len(pool.draining), "recommended": raw, "target": target,
            "num_waiting": m.num_waiting, "num_outstanding": m.num_outstanding, "kv_usage": m.kv_usage,
            "request_rate_per_s": m.request_rate_per_s, "ttft_s": m.ttft_s, "itl_s": m.itl_s,
            "slo_attainment": m.slo_attainment})

    def _begin_start(self, pool: Pool) -> None:
        g = pool.group
        name = f"{g.name or g.role}{pool.num_built}"
        pool.num_built += 1
        cold = cold_start_of(pool.cfg.cold_start, g.sim)
        s = _Start(Lifetime(pool.cfg.group, name, _gpus(g), g.sim.hardware.gpu, self.env.now), cold)
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
        self.attach(rep)
        self._watch(rep.index, rep.engine.start())
        self._event(pool, "ready", s.lifetime.name)

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
            rep.engine.close()  # it finishes what it holds; its loop's end removes it (_loop_ended)

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
