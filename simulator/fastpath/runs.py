"""Applying a planned run of plain decode steps to the engine, in bulk, as stepping would have.

Each component applies its own part (the scheduler's bulk owner: schedules, updates, blocks; the
simulated executor: prices and sampled tokens; the engine's book: rows, token times, finishes);
this object drives them in the stepping loop's order and keeps the fast path's counters.

Sync loop (nothing in flight): k x (schedule, update). Async loop (one step S in flight): schedule
the first step of the run, apply S's real update, then k-1 x (schedule, update of the previous
step); the run's last step stays in flight with a SchedulerOutput and ModelRunnerOutput shaped for
update_from_output, so the stepping loop resumes exactly where plain stepping would be. A tail
step is the async loop's next step scheduled at a run's last update time (before an arrival),
left in flight behind the one already there.
"""

from __future__ import annotations

from collections.abc import Sequence

from servesim.scheduler.bulk.interface import DecodeRuns
from servesim.scheduler.output import EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.request import Request
from servesim.simulator.engine import Engine, InFlight
from servesim.simulator.fastpath.through import progress_through, through_metrics, through_rows
from servesim.simulator.fastpath.timeline import FirstStep, RunClock
from servesim.simulator.step_book import PROGRESS_EVERY_STEPS


class RunApplier:
    def __init__(self, engine: Engine, runs: DecodeRuns, clock: RunClock) -> None:
        self.engine = engine
        self.runs = runs  # the scheduler's bulk decode path
        self.clock = clock
        self.until_s = -1.0  # the last update time of the last run applied: no arrival may precede it
        self.num_macro_steps = 0  # engine steps applied inside runs
        self.num_macro_runs = 0  # runs of two or more steps applied (sync or async, eager or deferred)
        self.num_runs_past_arrival = 0  # runs whose last update was due after an arrival
        self.num_bulk_finishes = 0  # requests finished inside a run's bulk update (not a stepped one)
        self.num_bulk_updates = 0  # step outputs applied by apply_update instead of update_from_output
        self.num_joined = 0  # requests admitted by a run's first schedule (DecodeRuns.decode_run_joining)

    def apply_update(self, so: SchedulerOutput, mro: ModelRunnerOutput, row: int, now: float) -> bool:
        """Engine.apply_output of a step nobody's token stops (RunPlanner.apply_update): the
        scheduler's side in bulk (DecodeRuns.update_sampled_step), then what apply_output records,
        in its order: progress, one token time per request that got a token (on_step_outputs'
        times for one-token outputs), the row's update and the book's statistics. Not where the
        clients take each step's outputs (the API server's serial loop)."""
        engine = self.engine
        if engine.clients.loop is not None:
            return False
        update = self.runs.update_sampled_step(so, mro, now)
        if update is None:
            return False
        book = engine.book
        if update.req_ids:
            engine.mark_progress(now)
            book.metrics.on_decode_run(update.req_ids, [now])
        book.record_update(row, now, mro, EngineCoreOutputs([], update.stats, []), None)
        self.num_bulk_updates += 1
        return True

    def tail_step(self, t: float, in_flight: InFlight, gpu_s: float | None, reqs: list[Request] | None = None,
                  ctx: list[int] | None = None, first: FirstStep | None = None) -> bool:
        """Schedule the async loop's next step, due at t (before the next arrival; nothing in the
        loop happens between), as the stepping loop would, and leave it in flight behind the
        step already there; False (nothing done) unless it is provably plain. The scheduler is in
        the loop-top state of time t (a run just applied is complete); gpu_s is the step's price
        when the run already has it (same contexts). `reqs`: that run's batch, given only when the
        run's own horizon covers this schedule too (it priced it: gpu_s), which then needs no
        second proof: the batch and its plainness are what the run's next schedule would have had;
        `ctx`, that run's contexts for it where it opens the run (joins: DecodeRuns.decode_run_joining),
        and `first` its price where a prompt joins it (RunClock.first_step)."""
        engine, runs = self.engine, self.runs
        if ((reqs is None and runs.decode_run_horizon(1, 1) < 1)
                or engine.watchdog.due(engine.book.num_steps + 1, t) or not t < self.clock.deadline_s()):
            return False
        if reqs is None:
            reqs = runs.decode_run_requests()
            joins = runs.decode_run_joining()
            ctx = [r.num_computed_tokens for r in reqs] + joins.decode_contexts()
            reqs += joins.requests
            first = self.clock.first_step(ctx, joins)
        elif ctx is None:
            ctx = [r.num_computed_tokens for r in reqs]  # the run (if any) already advanced them
        ids, n = [r.request_id for r in reqs], len(reqs)
        sim = self.clock.sim
        if first is not None:
            gpu_s = first.gpu_s
        elif gpu_s is None:
            (gpu_s,) = sim.decode_step_times_s(ctx, 1)
        finished = runs.finished_req_ids()
        eff = runs.schedule_decode_steps(reqs, 1, None, t)  # its prefix lookup is taken by the next update
        if eff.joined:
            self.joined(eff.joined, t)
        tokens = sim.sample_decode_run(ids, ctx, 1, finished)
        row = self.decode_row(t, n, eff.free_after[0], gpu_s, eff.joined_tokens)
        self.num_macro_steps += 1
        cpu_s = engine.cpu.step_s(n, n) if first is None else first.cpu_s
        end = max(t + cpu_s, engine.gpu_free_at) + gpu_s  # the loop's start + GPU time
        mro = sim.decode_step_output(ids, tokens.at_step(0))
        in_flight.append((runs.decode_step_output(reqs, eff.joined_tokens), mro, end, None, row))
        engine.gpu_free_at = end
        self.until_s = max(self.until_s, t)
        return True

    def decode_row(self, t: float, n: int, num_free_blocks: int, gpu_s: float,
                   joined_tokens: Sequence[int] = ()) -> int:
        """The step row of one plain decode step of n requests scheduled at t, as the book writes
        it when stepping (counts after the schedule); its update completes it. Returns the row.
        The last len(joined_tokens) of them joined at this schedule, computing these: prefill
        tokens, as StepBook.record_schedule counts a new request's."""
        runs, book = self.runs, self.engine.book
        running, waiting = self.engine.scheduler.get_request_counts()
        steps = book.metrics.steps
        num_joined = len(joined_tokens)
        row = steps.append(book.num_steps, t, n, sum(c for c in joined_tokens), n - num_joined,
                           runs.usage_at(num_free_blocks), running, waiting, 0)
        steps.set_gpu_time(row, gpu_s)
        book.num_steps += 1
        book.arrived_since_step = []
        return row

    def joined(self, reqs: list[Request], t: float) -> None:
        """Requests a run's first schedule (at t) admitted (DecodeRunEffects.joined), recorded as
        StepBook.record_schedule and the executor record a step's new requests: the first time
        each was scheduled, and the worker's state of it."""
        records, sim = self.engine.book.metrics.requests, self.clock.sim
        self.num_joined += len(reqs)
        for r in reqs:
            record = records[r.request_id]
            if record.first_scheduled_s is None:
                record.first_scheduled_s = t
            sim.admit_joined(r.request_id, r.num_prompt_tokens)

    def rows(self, first_step: int, sched_t: list[float], duration_s: list[float], gpu: list[float],
             free_after: list[int], n: int, hits: list[int], queries: list[int]) -> None:
        """Step rows as the book writes them when stepping (running and waiting counted after the
        schedule), completed as each update would: a step's prefix-cache stats are the lookups
        its update takes (hits, queries: one per row). The book's totals add them likewise."""
        runs, book = self.runs, self.engine.book
        running, waiting = self.engine.scheduler.get_request_counts()
        book.metrics.steps.extend_decode_run(first_step, sched_t, duration_s, gpu, n,
                                             runs.usages_at(free_after), running, waiting,
                                             hits, queries)
        book.prefix_hits += sum(h for h in hits)  # (generators: compiled loops)
        book.prefix_queries += sum(q for q in queries)

    def apply_sync(self, reqs: list[Request], ctx0: list[int], gpu: list[float], sched_t: list[float],
                   ends: list[float], upd_t: list[float]) -> float:
        """k x (schedule, update) with nothing in flight; returns the last update's time."""
        engine, runs, book = self.engine, self.runs, self.engine.book
        k = len(ends)
        ids = [r.request_id for r in reqs]
        tokens = self.clock.sim.sample_decode_run(ids, ctx0, k, runs.finished_req_ids())
        eff = runs.schedule_decode_steps(reqs, k, tokens, upd_t[-1])
        durations = [u - t for u, t in zip(upd_t, sched_t)]
        self.rows(book.num_steps, sched_t, durations, gpu[:k], eff.free_after, len(ids), eff.prefix_hits,
                  eff.prefix_queries)
        book.metrics.on_decode_run(ids, upd_t)
        self.progress(book.num_steps + 1, upd_t)  # update j runs when num_steps = first + j + 1
        book.num_steps += k
        self.num_macro_steps += k
        self.num_macro_runs += 1
        book.arrived_since_step = []
        engine.gpu_free_at = ends[-1]
        engine.mark_progress(upd_t[-1])
        self.until_s = upd_t[-1]
        return upd_t[-1]

    def apply_async(self, now: float, in_flight: InFlight, reqs: list[Request], ctx0: list[int],
                    gpu: list[float], sched_t: list[float], ends: list[float], upd_t: list[float],
                    each: list[int] | None = None, past_arrival: bool = False) -> float:
        """The async run of k = len(ends) >= 2 steps from the loop-top state at `now` (one step in
        flight); returns the last update's time. `each` (a run through finishes): reqs[i] takes
        the first each[i] steps. `past_arrival`: the last update is due after the next arrival,
        which commutes with it (MacroPlanner._past_arrival); an arrival may land before it."""
        engine, runs, sim, book = self.engine, self.runs, self.clock.sim, self.engine.book
        k = len(ends)
        ids = [r.request_id for r in reqs]
        steps = book.metrics.steps
        if each is not None and all(m >= k for m in each):  # (min(each) >= k, as a compiled loop)
            each = None  # the run stops before any finish (an arrival or a deadline cut it)
        # Schedule the run's first step (its CPU work overlaps the in-flight step S) ...
        finished = runs.finished_req_ids()
        eff_first = runs.schedule_decode_steps(reqs, 1, None, now)  # its prefix lookup: S's update takes it
        if eff_first.joined:  # the batch's last ones joined at this schedule (DecodeRuns.decode_run_joining)
            self.joined(eff_first.joined, sched_t[0])
        tokens = sim.sample_decode_run(ids, ctx0, k, finished, self.clock.scheduled_each(each))
        first = self.decode_row(sched_t[0], len(ids), eff_first.free_after[0], gpu[0], eff_first.joined_tokens)
        # ... then S's own update, exactly as the loop applies it ...
        so0, mro0, _end0, rec0, row0 = in_flight.popleft()
        engine.apply_output(so0, mro0, rec0, row0, now=upd_t[0])  # finishes the requests the run skipped
        # ... then k - 1 x (schedule the next step, apply the previous one's update).
        rest_each = None if each is None else [min(m, k) - 1 for m in each]
        rest = runs.schedule_decode_steps(reqs, k - 1, tokens, upd_t[-1], rest_each, upd_t[1:])
        sim.forget(rest.finished)
        # The run's second update applies the first step's output (and takes schedule 1's lookup).
        hits, queries = rest.prefix_hits, rest.prefix_queries
        steps.set_update(first, upd_t[1], hits[0], queries[0])
        book.prefix_hits += hits[0]
        book.prefix_queries += queries[0]
        if each is None:
            # step j (1 <= j < k - 1) ends at update j + 1; the last one's update is the next in-flight one
            durations = [upd_t[j + 1] - sched_t[j] for j in range(1, k - 1)]
            self.rows(book.num_steps, sched_t[1:k], durations, gpu[1:k], rest.free_after, len(ids),
                      hits[1:] + [0], queries[1:] + [0])
            book.metrics.on_decode_run(ids, upd_t[1:])
            self.progress(book.num_steps + 1, upd_t[1:])
            last_reqs, last_ids, last_toks = reqs, ids, tokens.at_step(k - 1)
        else:
            scheduled = self.clock.scheduled_each(each)
            assert scheduled is not None
            through_rows(self, book.num_steps, each, scheduled, sched_t, upd_t, gpu, rest.free_after, hits, queries)
            done = through_metrics(engine, reqs, each, upd_t)
            self.num_bulk_finishes += len(done)
            progress_through(book, book.num_steps + 1, upd_t[1:], done)
            kept = [i for i, m in enumerate(scheduled) if m >= k]  # the last step's batch
            last_reqs, last_ids = [reqs[i] for i in kept], [ids[i] for i in kept]
            last_toks = tokens.at_step(k - 1, kept)
        book.num_steps += k - 1
        self.num_macro_steps += k
        self.num_macro_runs += 1
        engine.mark_progress(upd_t[-1])
        last = sim.decode_step_output(last_ids, last_toks)
        in_flight.append((runs.decode_step_output(last_reqs), last, ends[-1], None, len(steps) - 1))
        engine.gpu_free_at = ends[-1]
        self.until_s = upd_t[-2] if past_arrival else upd_t[-1]
        self.num_runs_past_arrival += past_arrival
        return upd_t[-1]

    def progress(self, first_num_steps: int, update_times: list[float]) -> None:
        """The progress callback at the updates where the stepping loop would call it."""
        book = self.engine.book
        if book.progress is None:
            return
        for j, t in enumerate(update_times):
            if (first_num_steps + j) % PROGRESS_EVERY_STEPS == 0:
                book.progress(t, book.num_done)
