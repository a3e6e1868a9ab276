"""Deferred runs: a cluster replica's run applied when a request is routed to it, not before.

Behind a router that reads nothing of a replica but its load (least_outstanding), a run of plain
decode steps changes the load only at its first update (the in-flight step's, which finishes the
requests the async skip-ahead passed over), so every routing decision made during the run is the
same whatever the replica has applied of it, as long as the load it reads drops at that update's
time (Engine.num_outstanding subtracts them once the clock is past it: RunPlanner.load_drop). A
run through finishes (fastpath/through.py) lowers the load by one at each finishing update as
well: the plan keeps those times (DeferredRun.drop_t), and the load read at any instant is what
stepping shows. The eager path (MacroPlanner.advance) must stop each run at the first arrival the
router cannot *prove* goes elsewhere; measured on the 32-replica benchmark, 88 % of the runs so
cut stopped for an arrival that went to another replica, and each cut cost a tail step, a stepped
update and a new run.

A deferred run is planned (steps priced, timeline computed) but not applied. The engine waits for
its end; the run is applied then, whole, or earlier, inside Engine.submit, when the router sends
this replica a request at time t: exactly the run the eager path would have applied with t as its
bound (every update strictly before t, then the tail step), so the engine's state and outputs are
the eager ones, which are plain stepping's. Nothing else reads the replica in between: the router
and the other replicas' proofs read only its load (constant); client deadlines bound the plan.

Same-instant order: the eager path stops before an update that lands exactly on an arrival and
steps around it, keeping SimPy's event order. A deferred plan never contains an update at a
dispatch time (it ends before one; the cluster says which times are dispatches), so no routed
arrival can land on one of its updates and order never depends on when the plan is applied.

Paced runs (DeferredRuns.paced: P/D decode replicas, fastpath/pd_runs.py). Hand-offs and KV
landings come at times not known in advance, so one may land on an update's very instant, where
SimPy orders the two by when each event was created. A paced wait sets one wake-up per planned
update (Pacer), exactly when and as stepping's loop sets its timeout (at the previous update's
instant, for the GPU end of the step that update applies: Engine._apply_oldest), so every event
that reads or reaches the replica is processed before or after each of its updates as in stepping
(by induction over the instants: every event is created in the same order). DeferredRun.woken
counts the updates the clock has reached; an application at an outside event takes exactly those
(the read's view too: planned_reads.py, load_drop), then the tail step, and the wake-up already set
for the next update resumes the loop, which applies the older step in flight there as stepping's
loop does. The plan needs no dispatch-free times. Where the update the clock reaches next finishes
nobody and what the outside events read of the replica is its load or KV usage (commuting_arrivals:
fastpath/pd_runs.py), the early application takes that update too (as the non-paced past_arrival
does): its wake-up, already set, then only resumes the loop at its instant.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT

from servesim.scheduler.request import Request
from servesim.simulator.engine import Engine, InFlight
from servesim.simulator.fastpath.runs import RunApplier
from servesim.simulator.fastpath.timeline import FirstStep, RunClock, batch_at, exact_delays

# Steps priced when a deferred run is planned; each time the clock reaches the end of what is
# priced, the run grows by as many again (up to the scheduler's horizon), so a run that no
# arrival interrupts is applied once, whole, and pricing past an arrival wastes at most one chunk.
FIRST_CHUNK = 16


@dataclass(slots=True)
class DeferredRun:
    """A planned, not yet applied async run (the arguments of RunApplier.apply_async)."""

    now_s: float  # the loop-top time it was planned at (one step in flight)
    reqs: list[Request]  # the batch, in scheduling order
    ctx0: list[int]  # their num_computed_tokens at now_s
    gpu_s: list[float]  # each step's GPU time, as priced for the run
    sched_t: list[float]  # schedule, GPU end and update times of its steps (RunClock.timeline)
    ends: list[float]
    upd_t: list[float]
    routed: simpy.Event  # succeeds when a routed arrival applies the run early
    max_steps: int  # the scheduler's horizon: the run never grows past it
    complete: bool  # cut short (a dispatch time or a client deadline): it never grows
    load_drop: int  # requests the in-flight step's update finishes (at upd_t[0]; async skip-ahead)
    each: list[int] | None  # through finishes (fastpath/through.py): reqs[i] takes the first each[i] steps
    drop_t: list[float]  # ascending: the update times of the plan at which the load falls by one
    resume_at_s: float | None = None  # set when applied early: the in-flight step's update time
    past_arrival: bool = False  # applied early with that update too (MacroPlanner._past_arrival)
    scheduled: list[int] | None = None  # reqs[i] is scheduled in the first scheduled[i] steps (each + extra forward)
    woken: int = 0  # paced: the updates whose time the clock has reached (DeferredRuns.paced)
    num_joining: int = 0  # reqs' last ones join at its first schedule (DecodeRuns.decode_run_joining)
    first: FirstStep | None = None  # that schedule's price where a prompt joins it (RunClock.first_step)

    def set_drop_times(self) -> None:
        """The load falls by load_drop at the first update and by one at each finishing update
        (reqs[i] with each[i] = m finishes at upd_t[m]) the plan holds so far."""
        upd_t, drop_t = self.upd_t, [self.upd_t[0]] * self.load_drop
        if self.each is not None:
            drop_t += [upd_t[m] for m in sorted(self.each) if m < len(upd_t)]
        self.drop_t = drop_t

    def step_batch(self, j: int) -> list[Request]:
        """The requests step j of the run schedules."""
        return batch_at(self.reqs, self.scheduled, j)


class Pacer:
    """A paced run's wake-ups (module docstring, "Paced runs"): one event rescheduled for each
    planned update, at the turn stepping's timeout for it takes (a bare event's turn costs about
    half of resuming the engine loop there).

    Each wake-up is set when and as Engine._apply_oldest sets its timeout: at the previous update's
    instant (at the start, for the step in flight), for the GPU end of the step the update applies,
    as the clock's now + delay; none where that end is not in the future. So it takes stepping's
    place among same-instant events. At each wake-up the clock has reached one more update
    (DeferredRun.woken). The loop itself resumes only where stepping's does more than wait: at the
    run's end, and at the wake-up after an early application (apply_at sets resume_at_s). It resumes
    at an urgent event the wake-up schedules at its instant, processed next: no urgent event at this
    instant is waiting (urgent ones sort before the normal one being processed), so nothing comes
    between the wake-up and the loop's resumption, and what the loop then does comes at stepping's
    place. At most one wake-up is set at a time; a run starts pacing once the last one's loop
    resumed, so one event serves every run."""

    def __init__(self, runs: DeferredRuns) -> None:
        self.runs = runs
        self.env = runs.engine.env
        # Rescheduled once processed (SimPy's step then holds callbacks None); never failed.
        self.tick = simpy.Event(self.env)
        self.tick._ok = True
        self.tick._value = None
        self._on_tick_cb = self._on_tick  # one bound method for every wake-up
        self.plan: DeferredRun | None = None
        self.due0_s = 0.0  # the GPU end of the step in flight when the run was planned
        self.j = 0  # the next update the clock has not reached
        self.tick_at_s = 0.0  # when the wake-up set last comes (the clock's now then)
        self.resume: simpy.Event | None = None  # what the loop waits on

    def start(self, plan: DeferredRun, due0_s: float) -> simpy.Event | None:
        """Pace `plan` from its start (due0_s: the in-flight step's GPU end): the event the loop
        waits on, or None where the loop goes on at once (no update in the future)."""
        self.plan, self.due0_s, self.j = plan, due0_s, 0
        if self._advance(self.env.now):
            return None
        self.resume = resume = simpy.Event(self.env)
        return resume

    def _advance(self, now: float) -> bool:
        """Reach every update whose wake-up would not be in the future (now: the clock); set the
        next wake-up and return False, or return True where the loop goes on now (the run's end:
        it cannot grow; or the run was applied early)."""
        plan = self.plan
        assert plan is not None
        while True:
            j = self.j
            if j == len(plan.upd_t) and not self.runs.grow(plan):
                return True
            due_s = self.due0_s if j == 0 else plan.ends[j - 1]
            if due_s > now:
                tick = self.tick
                tick.callbacks = [self._on_tick_cb]
                delay_s = due_s - now
                self.env.schedule(tick, NORMAL, delay_s)
                # the clock's reading at the wake-up: SimPy schedules at its now + delay, this sum
                self.tick_at_s = now + delay_s
                return False
            if self._reached():
                return True

    def _reached(self) -> bool:
        """The clock reached update j: True where the run was applied early (the loop applies it)."""
        plan = self.plan
        assert plan is not None
        if plan.resume_at_s is not None:
            return True
        self.j += 1
        plan.woken = self.j
        return False

    def _on_tick(self, _event: simpy.Event) -> None:
        if self._reached() or self._advance(self.tick_at_s):
            resume = self.resume
            assert resume is not None
            resume._ok = True
            resume._value = None
            self.env.schedule(resume, URGENT)


class DeferredRuns:
    """Plans, waits for and applies one engine's deferred runs (the module docstring)."""

    def __init__(self, engine: Engine, clock: RunClock, applier: RunApplier, commuting_arrivals: bool) -> None:
        self.engine = engine
        self.clock = clock
        self.applier = applier
        # a routed arrival commutes with an update that finishes nobody (MacroPlanner._past_arrival);
        # off where a router reads more than the load (that update caches blocks a later read of
        # the prefix cache would see early: fastpath/planned_reads.py)
        self.commuting_arrivals = commuting_arrivals
        # collides(times): index of the first of the ascending times that is a dispatch time; None: off
        self.collides: Callable[[Sequence[float]], int] | None = None
        # Paced: the loop wakes at each planned update's time, with the timeout stepping would set
        # there (module docstring, "Paced runs"), so an outside event at any time, even one landing
        # on an update's instant, meets the run where stepping would (P/D decode replicas, whose
        # outside events come at times not known in advance: fastpath/pd_runs.py).
        self.paced = False
        self._pacer: Pacer | None = None  # a paced run's wake-ups (made at the first)
        self.pending: DeferredRun | None = None  # the planned run not yet applied
        self.num_deferred_runs = 0  # planned
        self.num_deferred_routed = 0  # applied at a routed arrival

    def plan(self, now: float, reqs: list[Request], ctx0: list[int], k: int, load_drop: int,
             each: list[int] | None, num_joining: int = 0, first: FirstStep | None = None) -> bool:
        """Plan a deferred run of at most k steps from this loop-top state (one step in flight,
        whose update finishes load_drop requests; `each`: a run through finishes; reqs' last
        num_joining join at its first schedule, priced `first` where a prompt does); False when it
        would be shorter than two updates."""
        clock = self.clock
        if each is None:
            gpu = clock.sim.decode_step_times_s(ctx0, min(k, FIRST_CHUNK))
            if first is not None:
                gpu[0] = first.gpu_s
            sched_t, ends, upd_t = clock.timeline(now, gpu, 1, len(reqs), math.inf, None,
                                                  None if first is None else first.cpu_s)
        else:
            gpu, (sched_t, ends, upd_t) = clock.plan_through(now, ctx0, each, min(k, FIRST_CHUNK), math.inf,
                                                             first=first)
        assert self.collides is not None
        n = self.collides(upd_t)  # the plan ends before an update landing on a dispatch time
        if n < 2:
            return False
        if n < len(upd_t):
            del sched_t[n:], ends[n:], upd_t[n:]
        plan = DeferredRun(now, reqs, ctx0, gpu, sched_t, ends, upd_t, self.engine.env.event(), k,
                           len(upd_t) < len(gpu), load_drop, each, [], scheduled=clock.scheduled_each(each),
                           num_joining=num_joining, first=first)
        plan.set_drop_times()
        self.pending = plan
        self.num_deferred_runs += 1
        return True

    def grow(self, plan: DeferredRun) -> bool:
        """Price and time the run's next chunk (as many steps again, within its horizon), from
        where it ends; False when it cannot grow."""
        m = len(plan.gpu_s)
        if plan.complete or m >= plan.max_steps:
            return False
        k = min(plan.max_steps, 2 * m)
        clock = self.clock
        if plan.each is None:
            gpu = clock.sim.decode_step_times_s([c + m for c in plan.ctx0], k - m)
            sched_t, ends, upd_t = clock.timeline(plan.upd_t[-1], gpu, 1, len(plan.reqs), math.inf, plan.ends[-1])
        else:
            gpu, (sched_t, ends, upd_t) = clock.plan_through(plan.upd_t[-1], plan.ctx0, plan.each, k, math.inf,
                                                             m, plan.ends[-1])
        assert self.collides is not None
        n = self.collides(upd_t)
        plan.complete = n < k - m
        plan.gpu_s += gpu
        plan.sched_t += sched_t[:n]
        plan.ends += ends[:n]
        plan.upd_t += upd_t[:n]
        if plan.each is not None:
            plan.set_drop_times()
        return n > 0

    def load_drop(self) -> int:
        """How far the load the router reads is below the scheduler's count now: the requests the
        pending run's updates finish (the first update's skipped-ahead ones, and through finishes
        each request at its last step's update) at the updates the clock is past (never at one: no
        dispatch lands on an update of a plan)."""
        plan = self.pending
        if plan is None or not plan.drop_t:
            return 0
        if self.paced:  # the drops at the updates the clock has reached
            return bisect_right(plan.drop_t, plan.upd_t[plan.woken - 1]) if plan.woken else 0
        return bisect_left(plan.drop_t, self.engine.env.now)  # the drops strictly before now

    def await_run(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        """The loop's wait through the pending run (a generator): to its end, where it is applied
        whole, or to the update of the oldest step in flight after an arrival applied it early."""
        plan = self.pending
        assert plan is not None
        if self.paced:
            yield from self._await_paced(plan, in_flight)
            return
        env = self.engine.env
        # A routed arrival applies the run early and triggers `routed` (apply_at): the run is
        # pending while it has not. (Not `self.pending is not None`: a compiled planner would
        # keep that narrowing across the yield, where the arrival sets the attribute to None.)
        routed = plan.routed
        while not routed.triggered:
            for delay_s in exact_delays(env.now, plan.upd_t[-1]):
                yield env.any_of([env.timeout(delay_s), routed])
                if routed.triggered:
                    break
            if not routed.triggered and not self.grow(plan):
                break
        if not routed.triggered:  # nothing was routed here: the whole run, as planned
            self.pending = None
            self.applier.apply_async(plan.now_s, in_flight, plan.reqs, plan.ctx0, plan.gpu_s, plan.sched_t,
                                     plan.ends, plan.upd_t, each=plan.each)
            return
        # Applied at an arrival: two steps in flight; the older one's update lands where stepping
        # puts it (a plan holds no update at a dispatch time, so none at the arrival's instant);
        # or one, that update already applied with the run: the loop resumes at its time.
        assert plan.resume_at_s is not None
        for delay_s in exact_delays(env.now, plan.resume_at_s):
            yield env.timeout(delay_s)
        if plan.past_arrival:
            return
        so, mro, _end, rec, row = in_flight.popleft()
        self.engine.apply_output(so, mro, rec, row)

    def _await_paced(self, plan: DeferredRun, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        """await_run, paced (Pacer: the wake-ups at each planned update). Resumed at the run's end,
        it applies the run whole; after an early application (apply_at), at the update the loop
        waits for, which it applies to the older step in flight exactly as the loop would."""
        pacer = self._pacer
        if pacer is None:
            pacer = self._pacer = Pacer(self)
        resume = pacer.start(plan, in_flight[0][2])
        if resume is not None:
            yield resume
        if plan.resume_at_s is not None:  # applied early: this is the update the loop waits for
            if not plan.past_arrival:  # (past_arrival: it came with the run; the loop resumes)
                so, mro, _end, rec, row = in_flight.popleft()
                self.engine.apply_output(so, mro, rec, row)
            return
        self.pending = None
        self.applier.apply_async(plan.now_s, in_flight, plan.reqs, plan.ctx0, plan.gpu_s, plan.sched_t,
                                 plan.ends, plan.upd_t, each=plan.each)

    def apply_at(self, t: float, in_flight: InFlight, routed: bool = True) -> None:
        """A request is routed here at t (or, `routed` False, a router's read needs the state at t:
        fastpath/planned_reads.py): apply the run as the eager path would have with t as its
        bound (updates strictly before t, then the tail step the loop schedules at the last of
        them), leaving two steps in flight."""
        plan = self.pending
        assert plan is not None
        self.pending = None
        self.num_deferred_routed += routed
        applier = self.applier
        # updates before t; plan.upd_t[j] > t (no update at t), or, paced, the updates reached
        j = plan.woken if self.paced else bisect_left(plan.upd_t, t)
        assert j < len(plan.upd_t) and (self.paced or plan.upd_t[j] > t), "deferred run: applied past its end"
        if j >= 1 and self.commuting_arrivals and (plan.each is None or j not in plan.each):
            # update j finishes nobody, so the load the router reads stays what stepping shows and
            # the arrival commutes with it (MacroPlanner._past_arrival): the run takes it too, the
            # tail step as its last schedule, leaving one step in flight
            applier.apply_async(plan.now_s, in_flight, plan.reqs, plan.ctx0, plan.gpu_s, plan.sched_t[:j + 1],
                                plan.ends[:j + 1], plan.upd_t[:j + 1], each=plan.each, past_arrival=True)
            plan.past_arrival = tailed = True
        elif j >= 2:
            resume_s = applier.apply_async(plan.now_s, in_flight, plan.reqs, plan.ctx0, plan.gpu_s,
                                           plan.sched_t[:j], plan.ends[:j], plan.upd_t[:j], each=plan.each)
            tailed = applier.tail_step(resume_s, in_flight, plan.gpu_s[j], plan.step_batch(j))
        else:  # the eager path: a tail-only step, then (one update before t) step, then tail
            tailed = applier.tail_step(plan.now_s, in_flight, plan.gpu_s[0], plan.reqs, plan.ctx0, plan.first)
            if tailed and j == 1:
                so, mro, _end, rec, row = in_flight.popleft()
                self.engine.apply_output(so, mro, rec, row, now=plan.upd_t[0])
                tailed = applier.tail_step(plan.upd_t[0], in_flight, plan.gpu_s[1], plan.step_batch(1))
        if not tailed:
            raise AssertionError(f"{self.engine.name}: a deferred run could not schedule its tail step")
        plan.resume_at_s = plan.upd_t[j]
        if not self.paced:  # a paced wait needs no event: its next timeout is already set
            plan.routed.succeed()
