"""Exact macro-steps: runs of plain decode steps applied in one engine call (the `RunPlanner`).

A plain decode step schedules one token for every running request and admits, preempts and
finishes nobody. When the state proves the next k steps are all plain and nothing from outside can
land before the last of them is applied, the planner applies the whole run at once; the SimPy
clock then jumps once to its end. Nothing can land means: no arrival (the announced next arrival,
strictly later than every schedule and update of the run), no client deadline before any of its
schedules, no request in the frontend, no policy timer; the scheduler's bulk owner bounds the run
itself (DecodeRuns.decode_run_horizon: no finish, no skip-ahead, no stop rule, KV blocks for every
boundary allocation without preemption, a waiting head refused alike at every schedule: its
prefix-cache lookups land in the run's step rows as each update takes them). An async run with
nothing waiting (a single engine's, or a cluster replica's deferred one) goes on through finishes
instead (fastpath/through.py).

Async tail: when the next update would meet the arrival, the step the loop schedules before it
(at the last update time, before the arrival) is still a plain decode step. The run schedules it
too (RunApplier.tail_step) and leaves two steps in flight; the loop then applies the older one's
update at its end, after the arrival, exactly as stepping does. Alone (the in-flight step's own
update already meets the arrival) the tail is a one-step run: each arrival saves a schedule().

A run's last update past an arrival: where the bulk owner proves that add_request and an update
that finishes nobody leave the same state in either order (arrivals_commute_with_decode_updates),
and nothing else the arrival sets off reads or writes what that update does (a single engine: no
router, no closed-loop client, no finish callback; the watchdog's window only moves forward), the
run goes one step further: the tail step becomes its last schedule and the update after it, due
after the arrival, is applied in bulk with the rest; the arrival is then added, before the loop
resumes at that update's time in the state stepping reaches there (`_past_arrival`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

import simpy

from servesim.scheduler.bulk.interface import DecodeRuns
from servesim.scheduler.hashing import TokenProvenance
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.simulator.engine import Engine, InFlight
from servesim.simulator.executor import SimExecutor
from servesim.simulator.fastpath.deferred import DeferredRuns
from servesim.simulator.fastpath.planned_reads import PlannedReads
from servesim.simulator.fastpath.run_length import PlanGate
from servesim.simulator.fastpath.runs import RunApplier
from servesim.simulator.fastpath.timeline import FirstStep, RunClock, Timeline, batch_at, exact_delays

MAX_MACRO_STEPS = 4096  # one run's length cap (bounds the step-time vector built per call)


class MacroPlanner:
    """The fast path of one engine: plans runs (this object), prices and times them (RunClock),
    applies them (RunApplier), defers them in a cluster (DeferredRuns)."""

    def __init__(self, engine: Engine, runs: DecodeRuns, sim: SimExecutor) -> None:
        self.engine = engine
        self.runs = runs  # the scheduler's bulk decode path
        self.clock = RunClock(engine, sim, runs.decode_run_extra_steps())
        self.applier = RunApplier(engine, runs, self.clock)
        # a run's last update may land past an arrival (_past_arrival)
        self.commuting_arrivals = runs.arrivals_commute_with_decode_updates()
        self.deferred = DeferredRuns(engine, self.clock, self.applier, self.commuting_arrivals)
        # The next arrival from outside; 0 = unknown (a run then never starts).
        self.next_arrival_s = 0.0
        self.arrival_bound: Callable[[int], float] | None = None  # expect_arrivals_by_load
        self.reads: PlannedReads | None = None  # a state-reading router's, with deferred runs
        # The next outside event's bound, recomputed at each loop top instead of announced (a P/D
        # decode replica's: fastpath/pd_runs.py); None: the announced next arrival.
        self.next_arrival_fn: Callable[[], float] | None = None
        # The finish callback reads no clock and nothing a run changes, so it may hear the in-flight
        # step's finishes when the run is applied, before their time (P/D decode replicas: pd_runs.py).
        self.finishes_heard_any_time = False
        self.gate = PlanGate()  # backs off while attempts fail (fastpath/run_length.py)

    # --- RunPlanner: what the engine calls ---------------------------------------------------------
    def has_pending_run(self) -> bool:
        return self.deferred.pending is not None

    def await_pending_run(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        return self.deferred.await_run(in_flight)

    def apply_update(self, so: SchedulerOutput, mro: ModelRunnerOutput, row: int, now: float) -> bool:
        return self.applier.apply_update(so, mro, row, now)

    def before_submit(self, now: float) -> None:
        if self.deferred.pending is not None:  # apply it up to this arrival (fastpath/deferred.py)
            self.deferred.apply_at(now, self.engine.in_flight)
        if not self.deferred.paced and not now > self.applier.until_s:  # a run's bound was wrong: not exact
            raise AssertionError(f"{self.engine.name}: a request arrived inside a macro-step (before "
                                 f"{self.applier.until_s!r} s)")

    def load_drop(self) -> int:
        return self.deferred.load_drop()

    def expect_next_arrival(self, t_s: float) -> None:
        self.next_arrival_s = t_s

    def expect_arrivals_by_load(self, bound: Callable[[int], float] | None) -> None:
        self.arrival_bound = bound

    def defer_runs(self, collides: Callable[[Sequence[float]], int] | None, reads_state: bool = False) -> None:
        if reads_state:  # the router reads KV usage or the prefix cache (fastpath/planned_reads.py)
            self.reads = PlannedReads.for_runs(self.engine, self.runs, self.deferred)
            if self.reads is None:
                return  # not answered from this bulk path's plans: runs are not deferred
        self.deferred.collides = collides

    def planned_kv_usage(self) -> float:
        assert self.reads is not None, "a router read KV usage of a deferred run it did not announce"
        return self.reads.kv_usage()

    def planned_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None,
                              provenance: TokenProvenance | None) -> int:
        assert self.reads is not None, "a router read the prefix cache of a deferred run it did not announce"
        return self.reads.cached_prefix_tokens(token_ids, lora_id, provenance)

    # --- counters (tests and benchmarks read them) ---------------------------------------------------
    @property
    def num_macro_steps(self) -> int:
        return self.applier.num_macro_steps

    @property
    def num_macro_runs(self) -> int:
        return self.applier.num_macro_runs

    @property
    def num_runs_past_arrival(self) -> int:
        return self.applier.num_runs_past_arrival

    @property
    def num_bulk_finishes(self) -> int:
        return self.applier.num_bulk_finishes

    @property
    def num_bulk_updates(self) -> int:
        return self.applier.num_bulk_updates

    @property
    def num_joined(self) -> int:
        return self.applier.num_joined

    @property
    def num_deferred_runs(self) -> int:
        return self.deferred.num_deferred_runs

    @property
    def num_deferred_routed(self) -> int:
        return self.deferred.num_deferred_routed

    # --- planning ----------------------------------------------------------------------------------
    def advance(self, now: float, in_flight: InFlight) -> list[float] | None:
        """Apply a run of plain decode steps from this loop-top state (RunPlanner.advance), when
        the gate lets this loop top attempt one (fastpath/run_length.py)."""
        if not self.gate.should_try():
            return None
        num_before = self.applier.num_macro_steps
        delays_s = self._plan(now, in_flight)
        self.gate.record(self.applier.num_macro_steps - num_before, self.deferred.pending is not None)
        return delays_s

    def _plan(self, now: float, in_flight: InFlight) -> list[float] | None:
        engine = self.engine
        # A paced run (P/D decode replicas, fastpath/pd_runs.py) meets every outside event at its
        # time, so no bound cuts it and, not deferred, nothing runs eagerly either.
        paced = self.deferred.paced and len(in_flight) == 1
        if self.next_arrival_fn is not None and not paced:
            self.next_arrival_s = self.next_arrival_fn()
        if not (paced or now < self.next_arrival_s) or engine.clients.num_in_frontend:
            return None
        runs, applier, clock = self.runs, self.applier, self.clock
        num_in_flight = len(in_flight)
        if (num_in_flight and not paced and self.arrival_bound is None
                and not self._first_update_s(now) < self.next_arrival_s):
            # the run's first update (the in-flight step's) would already meet the arrival
            return [] if applier.tail_step(now, in_flight, None) else None
        # An async run may go on through finishes (fastpath/through.py) where nobody outside hears
        # of them before it is applied: a single engine's, or a deferred one (the router reads the
        # load as it falls, fastpath/deferred.py); not the eager cluster path, whose proof reads a
        # constant load.
        deferrable = num_in_flight == 1 and self.deferred.collides is not None
        through = (num_in_flight == 1 and (deferrable or self.arrival_bound is None)
                   and (self._finishes_stay_inside() or (paced and self.finishes_heard_any_time)))
        k = runs.decode_run_horizon(MAX_MACRO_STEPS, num_in_flight, through)
        if k < 2 or engine.watchdog.due(engine.book.num_steps + 1, now):
            return None  # too short to pay, or the watchdog fires at the next schedule: step
        reqs = runs.decode_run_requests()
        joins = runs.decode_run_joining()  # completing their prompts at the run's first schedule
        # the skipped-ahead requests, which the first update finishes
        num_skipped = engine.scheduler.get_request_counts()[0] - len(reqs) - joins.num_running
        if num_skipped and not (self.finishes_heard_any_time or self._finishes_stay_inside()):
            return None
        load_change = -num_skipped
        ctx0 = [r.num_computed_tokens for r in reqs]
        first: FirstStep | None = None
        if joins.requests:
            reqs += joins.requests
            ctx0 += joins.decode_contexts()
            first = clock.first_step(ctx0, joins)
        each = runs.decode_run_steps(reqs, k) if through else None  # each request's schedules
        if each is not None and all(m >= k for m in each):  # (min(each) >= k, as a compiled loop)
            each = None  # nobody finishes inside: the fixed batch
        if deferrable and self.deferred.plan(now, reqs, ctx0, k, -load_change, each, len(joins.requests), first):
            return []  # fastpath/deferred.py: applied when a request is routed here, or at its end
        if paced:
            return None
        if through and self.arrival_bound is not None:  # not deferred after all: the eager path's run
            k = runs.decode_run_horizon(MAX_MACRO_STEPS, num_in_flight, False)
            if k < 2:
                return None
            each = None
        later_s = self._later_arrival_s(load_change)
        if num_in_flight and not self._first_update_s(now) < later_s:
            # a cluster router's proof covers the first update too (its arrivals-elsewhere count
            # decides the same whatever this replica's load); past it, only the tail step
            return [] if applier.tail_step(now, in_flight, None) else None
        gpu, tl = self._price(now, ctx0, each, k, num_in_flight, len(reqs), later_s, first)
        if len(tl[0]) < 2:  # one schedule fits before the arrival: the loop's next, as a tail step
            if num_in_flight and tl[0] and applier.tail_step(now, in_flight, gpu[0], reqs, ctx0, first):
                return []
            return None
        if not num_in_flight:
            return exact_delays(now, applier.apply_sync(reqs, ctx0, gpu, *tl))
        longer = self._past_arrival(now, gpu, tl, len(reqs), each, later_s)
        if longer is not None:  # the tail step and the update after it, due past the arrival
            return exact_delays(now, applier.apply_async(now, in_flight, reqs, ctx0, gpu, *longer, each=each,
                                                         past_arrival=True))
        resume_s = applier.apply_async(now, in_flight, reqs, ctx0, gpu, *tl, each=each)
        j = len(tl[0])  # the step the loop schedules at resume_s, priced when the run stopped short
        if j < len(gpu) and resume_s < clock.deadline_s():
            applier.tail_step(resume_s, in_flight, gpu[j], batch_at(reqs, clock.scheduled_each(each), j))
        return exact_delays(now, resume_s)

    def _price(self, now: float, ctx0: list[int], each: list[int] | None, k: int, num_in_flight: int,
               n: int, later_s: float, first: FirstStep | None) -> tuple[list[float], Timeline]:
        """Price and time up to k steps of the run. In growing chunks: an arrival usually ends the
        run long before the scheduler's own horizon. In a cluster (eager path) every replica's
        runs stop at the cluster's next arrival, often within two steps: the first chunk is just
        the two a run needs. A single engine's runs average ~13 steps (the Azure hour): a first
        chunk of 16 prices most in one call (one timeline instead of two; a step priced past the
        arrival costs ~0.25 us). A step's price does not depend on the chunking. `first`: the
        first step's price where a prompt joins it (RunClock.first_step)."""
        clock = self.clock
        if each is not None:  # the batch shrinks at finishes (fastpath/through.py)
            return clock.plan_through(now, ctx0, each, k, later_s, first=first)
        gpu: list[float] = []
        first_chunk = 16 if self.arrival_bound is None and self.engine.on_finish is None else 2
        first_cpu_s = None if first is None else first.cpu_s
        while True:
            m = min(k, max(16, 4 * len(gpu)) if gpu else first_chunk)
            priced = len(gpu)
            gpu += clock.sim.decode_step_times_s([c + len(gpu) for c in ctx0], m - len(gpu))
            if not priced and first is not None:
                gpu[0] = first.gpu_s
            tl = clock.timeline(now, gpu, num_in_flight, n, later_s, None, first_cpu_s)
            if len(tl[0]) < len(gpu) or len(gpu) == k:
                return gpu, tl

    def _past_arrival(self, now: float, gpu: list[float], tl: Timeline, n: int, each: list[int] | None,
                      later_s: float) -> Timeline | None:
        """The run's timeline one step longer, its last update due at or after the arrival that cut
        it (module docstring); None where that is not proven or not the case. The run stopped at
        j = len(tl[0]) steps with step j priced (the tail step's case); the update after step j
        (update j, the previous step's) must finish nobody: through finishes, request i's finish
        is update each[i] (vLLM: the scheduler that proves the commuting has no extra step). The
        longer timeline is the same arithmetic without the arrival's bound (piece by piece where
        the batch shrinks: plan_through with the prices it has), and must still schedule step j
        before any client deadline. Only step j is timed: the timeline continues from update j - 1
        and the GPU's end of step j - 1 (the floats do not depend on where a timeline is split), so
        its first j steps are tl's own."""
        j = len(tl[0])
        if (not self.commuting_arrivals or self.arrival_bound is not None or self.deferred.collides is not None
                or not self._finishes_stay_inside() or j >= len(gpu)):
            return None
        t, free_at = tl[2][j - 1], tl[1][j - 1]  # j >= 2: advance refuses shorter runs
        if each is None or all(m > j for m in each):
            step = self.clock.timeline(t, gpu[j:j + 1], 1, n, math.inf, free_at)
        elif j in each:
            return None  # update j finishes a request
        else:
            _, step = self.clock.plan_through(t, [], each, j + 1, math.inf, first_step=j, free_at=free_at, priced=gpu)
        if not step[0] or step[2][0] < later_s:
            return None
        return tl[0] + step[0], tl[1] + step[1], tl[2] + step[2]

    def _finishes_stay_inside(self) -> bool:
        """A request finishing inside the run (async: the in-flight step's update) must not set
        off anything outside: a client slot freeing (max_concurrency: the next send, now) or a
        router hearing of it."""
        engine = self.engine
        return engine.clients.max_concurrency is None and engine.on_finish is None

    def _later_arrival_s(self, load_change: int) -> float:
        """The earliest time a request can reach this engine after the run's first update (which
        finishes -load_change skipped-ahead requests): the announced next arrival, or a later one
        where the cluster's router proves the arrivals before it go elsewhere. This engine's
        load is then constant through the run (no admission, no finish), so a router that reads
        only the load sees the same value mid-run as stepping would show it."""
        if self.arrival_bound is None:
            return self.next_arrival_s
        return max(self.next_arrival_s, self.arrival_bound(self.engine.num_outstanding + load_change))

    def _first_update_s(self, now: float) -> float:
        """When the async loop applies the in-flight step's update: the timeline's first update
        time, known before any step is priced."""
        due = self.engine.gpu_free_at
        return now + (due - now) if due > now else now
