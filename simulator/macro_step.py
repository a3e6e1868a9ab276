"""Exact macro-steps: a run of plain decode steps advanced in one engine call (SimConfig.macro_steps).

A plain decode step schedules one token for every running request and admits, preempts and
finishes nobody. When the state proves the next k steps are all plain and nothing from outside can
land before the last of them is applied, the engine applies the whole run at once; the SimPy
clock then jumps once to its end. Nothing can land means: no arrival (the announced next arrival,
strictly later than every schedule and update of the run), no client deadline before any of its
schedules, no request in the frontend, no policy timer; the scheduler bounds the run itself
(the bulk path's decode_run_horizon: no finish, no skip-ahead, no stop rule, KV blocks for every
boundary allocation without preemption, a waiting head refused alike at every schedule: its
prefix-cache lookups land in the run's step rows as each update takes them). An async run with
nothing waiting (a single engine's, or a cluster replica's deferred one) goes on through finishes
instead: the batch shrinks by each request whose last step was scheduled, and that step's update
finishes it (finish_run.py).

Each component owns its bulk operation:
- the scheduler's bulk decode path, an owner object beside it (scheduler/bulk/, built once by
  decode_runs_for from the name the scheduler declares): decode_run_horizon / schedule_decode_steps
  / decode_step_output (scheduler/bulk/vllm.py), which hands the block allocations and prefix-cache
  insertions to KVDecodeRuns.decode_run_fit / apply_decode_run (scheduler/bulk/kv.py, vLLM's order);
- SimExecutor.decode_step_times_s (the cost model's floats), sample_decode_run (BatchTracker and
  TokenSource: the same tokens), decode_step_output;
- MetricsCollector.on_decode_run / StepTable.extend_decode_run (token timestamps, step rows);
- the engine (this mixin): the timeline, with the stepping loop's exact float arithmetic.

Sync loop (nothing in flight): k x (schedule, update). Async loop (one step S in flight): schedule
the first step of the run, apply S's real update, then k-1 x (schedule, update of the previous
step); the run's last step stays in flight with a SchedulerOutput and ModelRunnerOutput shaped for
update_from_output, so the stepping loop resumes exactly where plain stepping would be.

Async tail: when the next update would meet the arrival, the step the loop schedules before it
(at the last update time, before the arrival) is still a plain decode step. The run schedules it
too ("tail step") and leaves two steps in flight; the loop then applies the older one's update
at its end, after the arrival, exactly as stepping does. Alone (the in-flight step's own update
already meets the arrival) the tail is a one-step macro-step: each arrival saves a schedule().

A run's last update past an arrival: where the scheduler proves that add_request and an update
that finishes nobody leave the same state in either order
(DecodeRuns.arrivals_commute_with_decode_updates), and nothing else the arrival sets off
reads or writes what that update does (a single engine: no router, no closed-loop client, no
finish callback; the watchdog's window only moves forward), the run instead goes one step
further: the tail step becomes its last schedule and the update after it, due after the arrival,
is applied in bulk with the rest; the arrival is then added, before the loop resumes at that
update's time in the state stepping reaches there (`_past_arrival`).

The scheduler side is scheduler.bulk.interface.DecodeRuns: vLLM's (scheduler/bulk/vllm.py) and
SGLang's (scheduler/bulk/sglang.py, whose finishing request is scheduled once more: its
overlap's extra forward, `_scheduled_each`). Where a macro-step cannot be exact the engine steps;
`macro_fallback_reason` says why (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from servesim.scheduler.request import Request
from servesim.simulator.deferred_run import DeferredRunMixin, batch_at, exact_delays
from servesim.simulator.executor import SimExecutor
from servesim.simulator.finish_run import Timeline
from servesim.simulator.kernel_impl import step_timeline

if TYPE_CHECKING:
    from servesim.scheduler.bulk.interface import DecodeRuns
    from servesim.simulator.engine import Engine, InFlight

MAX_MACRO_STEPS = 4096  # one run's length cap (bounds the step-time vector built per call)


def macro_fallback_reason(engine: Engine) -> str | None:
    """Why macro-steps can never apply to this engine (None: they may, run by run)."""
    cfg, runs = engine.cfg, engine._decode_runs
    if not cfg.macro_steps:
        return "macro_steps is off"
    if runs is None:  # declared by the scheduler (SchedulerCapabilities.decode_runs), not told by its type
        return (f"scheduler {type(engine.scheduler).__name__} declares no bulk decode path "
                "(P/D and other schedulers that change what a step does step)")
    if cfg.hardware.pp > 1:
        return "pipeline parallelism: a batch per stage in flight, timed stage by stage"
    if cfg.scheduler.num_spec_tokens:
        return "speculative decoding: acceptance draws change the batch's token counts step by step"
    if not isinstance(engine.executor, SimExecutor):
        return "the executor is not the simulated one (GPU runner: every step runs the model)"
    if engine.step_trace is not None:
        return "a step trace records every step"
    return runs.decode_run_blocker()


class MacroStepMixin(DeferredRunMixin):
    """Mixed into Engine: plans and applies one macro-step; the loop yields once to its end."""

    def _runs(self: Engine) -> DecodeRuns:
        """The scheduler's bulk decode path (a run is planned only on one: macro_fallback_reason)."""
        runs = self._decode_runs
        assert runs is not None
        return runs

    def _sim_executor(self: Engine) -> SimExecutor:
        """The simulated executor, which prices and samples runs (macro_fallback_reason)."""
        sim = self._sim
        assert sim is not None
        return sim

    def _macro_step(self: Engine, now: float, in_flight: InFlight) -> list[float] | None:
        """Apply a run of plain decode steps from this loop-top state; return the delays to wait
        before the loop resumes (the SimPy clock then reads exactly what stepping would have
        reached), or None to step normally."""
        if not now < self._next_arrival_s or self.clients.num_in_frontend:
            return None
        sched = self._runs()
        num_in_flight = len(in_flight)
        if num_in_flight and self._arrival_bound is None and not self._first_update_s(now) < self._next_arrival_s:
            # the run's first update (the in-flight step's) would already meet the arrival
            return [] if self._tail_step(now, in_flight, None) else None
        # An async run may go on through finishes (finish_run.py) where nobody outside hears of
        # them before it is applied: a single engine's, or a deferred one (the router reads the
        # load as it falls, deferred_run.py); not the eager cluster path, whose proof reads a
        # constant load.
        deferrable = num_in_flight == 1 and self._collides is not None
        through = (num_in_flight == 1 and (deferrable or self._arrival_bound is None)
                   and self._finishes_stay_inside())
        k = sched.decode_run_horizon(MAX_MACRO_STEPS, num_in_flight, through)
        if k < 2 or self.num_steps + 1 > self._stall_step or now > self._stall_s:
            return None  # too short to pay, or the watchdog fires at the next schedule: step
        reqs = sched.decode_run_requests()
        if len(reqs) < self.scheduler.get_request_counts()[0] and not self._finishes_stay_inside():
            return None
        each = sched.decode_run_steps(reqs, k) if through else None  # each request's schedules
        if each is not None and min(each) >= k:
            each = None  # nobody finishes inside: the fixed batch
        ctx0 = [r.num_computed_tokens for r in reqs]
        load_change = len(reqs) - self.scheduler.get_request_counts()[0]
        if deferrable and self._plan_deferred(now, reqs, ctx0, k, -load_change, each):
            return []  # deferred_run.py: applied when a request is routed here, or at its end
        if through and self._arrival_bound is not None:  # not deferred after all: the eager path's run
            k = sched.decode_run_horizon(MAX_MACRO_STEPS, num_in_flight, False)
            if k < 2:
                return None
            each = None
        later_s = self._later_arrival_s(load_change)
        if num_in_flight and not self._first_update_s(now) < later_s:
            # a cluster router's proof covers the first update too (arrivals_elsewhere decides the
            # same whatever this replica's load); past it, only the tail step
            return [] if self._tail_step(now, in_flight, None) else None
        # Price the steps in growing chunks: an arrival usually ends the run long before the
        # scheduler's own horizon. In a cluster (eager path) every replica's runs stop at the
        # cluster's next arrival, often within two steps: the first chunk is just the two a run
        # needs. A single engine's runs average ~13 steps (the Azure hour): a first chunk of 16
        # prices most in one call (one timeline instead of two; a step priced past the arrival
        # costs ~0.25 us). A step's price does not depend on the chunking.
        gpu: list[float] = []
        first = 16 if self._arrival_bound is None and self.on_finish is None else 2
        if each is not None:  # the batch shrinks at finishes (finish_run.py)
            gpu, tl = self._plan_through(now, ctx0, each, k, later_s)
        sim = self._sim_executor()
        while each is None:
            m = min(k, max(16, 4 * len(gpu)) if gpu else first)
            gpu += sim.decode_step_times_s([c + len(gpu) for c in ctx0], m - len(gpu))
            tl = self._macro_timeline(now, gpu, num_in_flight, len(reqs), later_s)
            if len(tl[0]) < len(gpu) or len(gpu) == k:
                break
        if len(tl[0]) < 2:
            return None
        if not num_in_flight:
            return exact_delays(now, self._macro_sync(reqs, ctx0, gpu, *tl))
        longer = self._past_arrival(now, gpu, tl, len(reqs), each, later_s)
        if longer is not None:  # the tail step and the update after it, due past the arrival
            return exact_delays(now, self._macro_async(now, in_flight, reqs, ctx0, gpu, *longer, each=each,
                                                       past_arrival=True))
        resume_s = self._macro_async(now, in_flight, reqs, ctx0, gpu, *tl, each=each)
        j = len(tl[0])  # the step the loop schedules at resume_s, priced when the run stopped short
        if j < len(gpu) and resume_s < self._deadline_s():
            self._tail_step(resume_s, in_flight, gpu[j], batch_at(reqs, self._scheduled_each(each), j))
        return exact_delays(now, resume_s)

    def _past_arrival(self: Engine, now: float, gpu: list[float], tl: Timeline, n: int, each: list[int] | None,
                      later_s: float) -> Timeline | None:
        """The run's timeline one step longer, its last update due at or after the arrival that cut
        it (module docstring); None where that is not proven or not the case. The run stopped at
        j = len(tl[0]) steps with step j priced (the tail step's case); the update after step j
        (update j, the previous step's) must finish nobody: through finishes, request i's finish
        is update each[i] (vLLM: the scheduler that proves the commuting has no extra step). The
        longer timeline is the same arithmetic without the arrival's bound (piece by piece where
        the batch shrinks: _plan_through with the prices it has), and must still schedule step j
        before any client deadline. Only step j is timed: the timeline continues from update j - 1
        and the GPU's end of step j - 1 (the floats do not depend on where a timeline is split), so
        its first j steps are tl's own."""
        j = len(tl[0])
        if (not self._commuting_arrivals or self._arrival_bound is not None or self._collides is not None
                or not self._finishes_stay_inside() or j >= len(gpu)):
            return None
        t, free_at = tl[2][j - 1], tl[1][j - 1]  # j >= 2: _macro_step refuses shorter runs
        if each is None or min(each) > j:
            step = self._macro_timeline(t, gpu[j:j + 1], 1, n, math.inf, free_at)
        elif j in each:
            return None  # update j finishes a request
        else:
            _, step = self._plan_through(t, [], each, j + 1, math.inf, first_step=j, free_at=free_at, priced=gpu)
        if not step[0] or step[2][0] < later_s:
            return None
        return tl[0] + step[0], tl[1] + step[1], tl[2] + step[2]

    def _scheduled_each(self: Engine, each: list[int] | None) -> list[int] | None:
        """How many of a run's steps schedule each request, from how many bring it a token
        (`each`): SGLang's overlap schedules a finishing request once more (the extra forward,
        DecodeRuns.decode_run_extra_steps); vLLM's skip-ahead does not."""
        x = self._decode_run_extra
        return each if each is None or x == 0 else [m + x for m in each]

    def _tail_step(self: Engine, t: float, in_flight: InFlight, gpu_s: float | None,
                   reqs: list[Request] | None = None) -> bool:
        """Schedule the async loop's next step, due at t (before the next arrival; nothing in the
        loop happens between), as the stepping loop would, and leave it in flight behind the
        step already there; False (nothing done) unless it is provably plain. The scheduler is in
        the loop-top state of time t (a run just applied is complete); gpu_s is the step's price
        when the run already has it (same contexts). `reqs`: that run's batch, given only when the
        run's own horizon (decode_run_horizon when it was planned) covers this schedule too (it
        priced it: gpu_s), which then needs no second proof: the batch and its plainness are
        what the run's next schedule would have had."""
        sched = self._runs()
        if ((reqs is None and sched.decode_run_horizon(1, 1) < 1) or self.num_steps + 1 > self._stall_step
                or t > self._stall_s or not t < self._deadline_s()):
            return False
        if reqs is None:
            reqs = sched.decode_run_requests()
        ids, n = [r.request_id for r in reqs], len(reqs)
        ctx = [r.num_computed_tokens for r in reqs]  # the run (if any) already advanced them
        sim = self._sim_executor()
        if gpu_s is None:
            (gpu_s,) = sim.decode_step_times_s(ctx, 1)
        finished = sched.finished_req_ids()
        eff = sched.schedule_decode_steps(reqs, 1, None, t)  # its prefix lookup is taken by the next update
        tokens = sim.sample_decode_run(ids, ctx, 1, finished)
        row = self._decode_row(t, n, eff.free_after[0], gpu_s)
        self.num_macro_steps += 1
        end = max(t + self.cpu.step_s(n, n), self._gpu_free_at) + gpu_s  # the loop's start + GPU time
        mro = sim.decode_step_output(ids, tokens.at_step(0))
        in_flight.append((sched.decode_step_output(reqs), mro, end, None, row))
        self._gpu_free_at = end
        self._macro_until_s = max(self._macro_until_s, t)
        return True

    def _decode_row(self: Engine, t: float, n: int, num_free_blocks: int, gpu_s: float) -> int:
        """The step row of one plain decode step of n requests scheduled at t, as _on_schedule
        writes it (counts after the schedule); its update completes it. Returns the row."""
        running, waiting = self.scheduler.get_request_counts()
        steps = self.metrics.steps
        row = steps.append(self.num_steps, t, n, 0, n, self._runs().usage_at(num_free_blocks),
                           running, waiting, 0)
        steps.set_gpu_time(row, gpu_s)
        self.num_steps += 1
        self._arrived_since_step = []
        return row

    def _deadline_s(self: Engine) -> float:
        return self._deadlines[0][0] if self._deadlines else math.inf

    def _finishes_stay_inside(self: Engine) -> bool:
        """A request finishing inside the run (async: the in-flight step's update) must not set
        off anything outside: a client slot freeing (max_concurrency: the next send, now) or a
        router hearing of it."""
        return self.clients.max_concurrency is None and self.on_finish is None

    def _later_arrival_s(self: Engine, load_change: int) -> float:
        """The earliest time a request can reach this engine after the run's first update (which
        finishes -load_change skipped-ahead requests): the announced next arrival, or a later one
        where the cluster's router proves the arrivals before it go elsewhere. This engine's
        load is then constant through the run (no admission, no finish), so a router that reads
        only the load sees the same value mid-run as stepping would show it."""
        if self._arrival_bound is None:
            return self._next_arrival_s
        return max(self._next_arrival_s, self._arrival_bound(self.num_outstanding + load_change))

    def _first_update_s(self: Engine, now: float) -> float:
        """When the async loop applies the in-flight step's update: _macro_timeline's first update
        time, known before any step is priced."""
        due = self._gpu_free_at
        return now + (due - now) if due > now else now

    def _macro_timeline(self: Engine, now: float, gpu: list[float], num_in_flight: int, n: int, later_s: float,
                        free_at: float | None = None) -> Timeline:
        """(schedule times, GPU end times, update times) of the steps that fit before any outside
        event, with the stepping loop's float arithmetic (kernels.step_timeline): start = max(now +
        cpu, GPU free), end = start + gpu, and the clock reaches a step's end as now + (end - now)
        (SimPy's timeout). The update after schedule j is step j's own (sync) or the previous one's
        (async). Every update precedes `later_s`: the next arrival, or in a cluster the first
        arrival its router cannot prove goes elsewhere whatever this replica's load
        (_later_arrival_s); every schedule precedes the first client deadline. `free_at` (default:
        the engine's GPU-free time) continues a timeline from its last update at `now`, where the
        GPU frees at its last end (a deferred run growing, deferred_run.py)."""
        return step_timeline(now, gpu, num_in_flight, self.cpu.step_s(n, n), later_s, self._deadline_s(),
                             self._gpu_free_at if free_at is None else free_at)

    def _macro_rows(self: Engine, first_step: int, sched_t: list[float], duration_s: list[float], gpu: list[float],
                    free_after: list[int], n: int, hits: list[int], queries: list[int]) -> None:
        """Step rows as _on_schedule writes them (running and waiting counted after the schedule)
        and _on_update completes them: a step's prefix-cache stats are the lookups its update
        takes (hits, queries: one per row; the in-flight last step's get set at its update).
        The engine's totals add them as _on_update does."""
        running, waiting = self.scheduler.get_request_counts()
        self.metrics.steps.extend_decode_run(first_step, sched_t, duration_s, gpu, n,
                                             self._runs().usages_at(free_after), running, waiting, hits, queries)
        self.prefix_hits += sum(hits)
        self.prefix_queries += sum(queries)

    def _macro_sync(self: Engine, reqs: list[Request], ctx0: list[int], gpu: list[float], sched_t: list[float],
                    ends: list[float], upd_t: list[float]) -> float:
        k = len(ends)
        sched, ids = self._runs(), [r.request_id for r in reqs]
        tokens = self._sim_executor().sample_decode_run(ids, ctx0, k, sched.finished_req_ids())
        eff = sched.schedule_decode_steps(reqs, k, tokens, upd_t[-1])
        durations = [u - t for u, t in zip(upd_t, sched_t)]
        self._macro_rows(self.num_steps, sched_t, durations, gpu[:k], eff.free_after, len(ids),
                         eff.prefix_hits, eff.prefix_queries)
        self.metrics.on_decode_run(ids, upd_t)
        self._macro_progress(self.num_steps + 1, upd_t)  # update j runs when num_steps = first + j + 1
        self.num_steps += k
        self.num_macro_steps += k
        self.num_macro_runs += 1
        self._arrived_since_step = []
        self._gpu_free_at = ends[-1]
        self._mark_progress(upd_t[-1])
        self._macro_until_s = upd_t[-1]
        return upd_t[-1]

    def _macro_async(self: Engine, now: float, in_flight: InFlight, reqs: list[Request], ctx0: list[int],
                     gpu: list[float], sched_t: list[float], ends: list[float], upd_t: list[float],
                     each: list[int] | None = None, past_arrival: bool = False) -> float:
        """`each` (a run through finishes, finish_run.py): reqs[i] takes the first each[i] steps.
        `past_arrival`: the last update is due after the next arrival, which commutes with it
        (_past_arrival); an arrival may land before it."""
        k = len(ends)  # >= 2 (_macro_step)
        sched, ids, sim = self._runs(), [r.request_id for r in reqs], self._sim_executor()
        steps = self.metrics.steps
        if each is not None and min(each) >= k:
            each = None  # the run stops before any finish (an arrival or a deadline cut it)
        # Schedule the run's first step (its CPU work overlaps the in-flight step S) ...
        finished = sched.finished_req_ids()
        eff_first = sched.schedule_decode_steps(reqs, 1, None, now)  # its prefix lookup: S's update takes it
        tokens = sim.sample_decode_run(ids, ctx0, k, finished, self._scheduled_each(each))
        first = self._decode_row(sched_t[0], len(ids), eff_first.free_after[0], gpu[0])
        # ... then S's own update, exactly as the loop applies it ...
        so0, mro0, _end0, rec0, row0 = in_flight.popleft()
        self._on_update(so0, mro0, rec0, row0, now=upd_t[0])  # finishes the requests the run skipped
        # ... then k - 1 x (schedule the next step, apply the previous one's update).
        rest_each = None if each is None else [min(m, k) - 1 for m in each]
        rest = sched.schedule_decode_steps(reqs, k - 1, tokens, upd_t[-1], rest_each, upd_t[1:])
        sim.forget(rest.finished)
        # The run's second update applies the first step's output (and takes schedule 1's lookup).
        hits, queries = rest.prefix_hits, rest.prefix_queries
        steps.set_update(first, upd_t[1], hits[0], queries[0])
        self.prefix_hits += hits[0]
        self.prefix_queries += queries[0]
        if each is None:
            # step j (1 <= j < k - 1) ends at update j + 1; the last one's update is the next in-flight one
            durations = [upd_t[j + 1] - sched_t[j] for j in range(1, k - 1)]
            self._macro_rows(self.num_steps, sched_t[1:k], durations, gpu[1:k], rest.free_after, len(ids),
                             hits[1:] + [0], queries[1:] + [0])
            self.metrics.on_decode_run(ids, upd_t[1:])
            self._macro_progress(self.num_steps + 1, upd_t[1:])
            last_reqs, last_ids, last_toks = reqs, ids, tokens.at_step(k - 1)
        else:
            self._through_rows(self.num_steps, each, sched_t, upd_t, gpu, rest.free_after, hits, queries)
            self._progress_through(self.num_steps + 1, upd_t[1:], self._through_metrics(reqs, each, upd_t))
            scheduled = self._scheduled_each(each)
            assert scheduled is not None
            kept = [i for i, m in enumerate(scheduled) if m >= k]  # the last step's batch
            last_reqs, last_ids = [reqs[i] for i in kept], [ids[i] for i in kept]
            last_toks = tokens.at_step(k - 1, kept)
        self.num_steps += k - 1
        self.num_macro_steps += k
        self.num_macro_runs += 1
        self._mark_progress(upd_t[-1])
        last = sim.decode_step_output(last_ids, last_toks)
        in_flight.append((sched.decode_step_output(last_reqs), last, ends[-1], None, len(steps) - 1))
        self._gpu_free_at = ends[-1]
        self._macro_until_s = upd_t[-2] if past_arrival else upd_t[-1]
        self.num_runs_past_arrival += past_arrival
        return upd_t[-1]

    def _macro_progress(self: Engine, first_num_steps: int, update_times: list[float]) -> None:
        """The progress callback at the updates where the stepping loop would call it."""
        if self.progress is None:
            return
        for j, t in enumerate(update_times):
            if (first_num_steps + j) % 256 == 0:
                self.progress(t, self._num_done)
