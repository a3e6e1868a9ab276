"""Exact macro-steps for speculative decoding: runs of verify steps applied at once (a `RunPlanner`).

A verify step of a steady batch (scheduler/bulk/spec.py) schedules 1 + num_spec_tokens tokens for
every running request; how many drafts it accepts is a pure function of the request and its output
position (TokenSource.accepted_run), so a run's acceptances, and with them every step's token
counts, contexts, block allocations and clawbacks, are known before it is applied. The planner
draws them in chunks (the first sized to the time left before the next arrival, then doubling),
lets the scheduler's bulk owner prove the steps plain and find the finishes inside
(`VllmSpecRuns.plan`: no max_model_len cut, blocks without preemption; async, a request reaching
max_tokens is passed over and stopped inside the run), prices each step with the executor's own
call on its exact StepShape, times the steps with the stepping loop's float arithmetic
(kernels.step_timeline: every update strictly before the next arrival, every schedule before the
first client deadline) and applies the run: scheduler and KV state (bulk owner), worker state,
step rows, token times, finishes, the progress callback, and (async) the last step left in
flight with the SchedulerOutput and ModelRunnerOutput stepping would have left.

Sync loop (nothing in flight): k x (schedule, its update); runs end before an update that stops
a request. Async loop (step S in flight): k x (schedule, the previous step's update), the first
update being S's; the run's last step stays in flight, and where the next update meets the
arrival the loop's next schedule (the tail) is applied too. Where one new request waits (async),
the run's first schedule admits it (a join, scheduler/bulk/spec_join.py): that step is priced as
the mixed step it is and timed alone, and the joiner is one more request of the batch from the
next schedule on. Only for an engine without a finish callback or client slots, with nothing in
the frontend.

A cluster replica's run is bounded by its router's proof (expect_arrivals_by_load): updates
strictly before the first arrival the proof cannot send elsewhere while this replica's load stays
what it is, and the run ends before any update that would finish a request (sync's rule, async
too), so the load every other decision reads mid-run is the one stepping shows. Runs are never
deferred (defer_runs is accepted and ignored: deferral is the plain decode planner's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from servesim.scheduler.bulk.spec import VllmSpecRuns
from servesim.scheduler.bulk.spec_join import SpecJoin
from servesim.scheduler.bulk.spec_plan import SpecRunPlan
from servesim.scheduler.hashing import TokenProvenance
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.request import Request
from servesim.scheduler.step_shape import StepShape
from servesim.simulator.engine import Engine, InFlight
from servesim.simulator.executor import SimExecutor
from servesim.simulator.fastpath.spec_rows import SpecRunRecorder
from servesim.simulator.fastpath.timeline import exact_delays
from servesim.simulator.kernels import step_timeline

MAX_SPEC_STEPS = 4096  # one run's length cap (as MacroPlanner's)
FIRST_CHUNK_STEPS = 16  # steps drawn first when no arrival or deadline bounds the run; each next chunk doubles it


@dataclass(slots=True, frozen=True)
class Tail:
    """An async run's tail: the loop's next schedule, at the run's last update time, whose own
    update (after the previous step's) meets the next arrival: applied with the run, left in flight."""

    rows: list[int]  # the batch indices it schedules
    gpu_s: float  # its GPU time
    end_s: float  # its GPU end


class SpecPlanner:
    """The fast path of one engine with speculative decoding (implements RunPlanner)."""

    def __init__(self, engine: Engine, runs: VllmSpecRuns, sim: SimExecutor) -> None:
        self.engine = engine
        self.runs = runs
        self.sim = sim
        self.num_spec_tokens = engine.cfg.scheduler.num_spec_tokens
        self.next_arrival_s = 0.0  # 0 = unknown: no run starts
        # A cluster router's proof (expect_arrivals_by_load): runs then end before any finish, so
        # the load the proof reads stays what stepping shows through the run.
        self.arrival_bound: Callable[[int], float] | None = None
        self.until_s = -1.0  # the last update time of the last run: no arrival may precede it
        self.num_macro_steps = 0
        self.num_macro_runs = 0
        self.num_bulk_finishes = 0  # requests finished inside a run's bulk update
        self.num_joined = 0  # prompts a run's first schedule admitted (bulk/spec_join.py)
        self.num_chunks_joined = 0  # prompts' last chunks a run's first schedule computed
        self.recorder = SpecRunRecorder(engine, runs)  # a run's step rows and token times

    # --- RunPlanner --------------------------------------------------------------------------------
    def has_pending_run(self) -> bool:
        return False  # runs are applied when planned, never deferred

    def await_pending_run(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        raise AssertionError("a spec run is never pending")
        yield  # a generator, as the protocol says

    def apply_update(self, so: SchedulerOutput, mro: ModelRunnerOutput, row: int, now: float) -> bool:
        return False  # a verify step's update claws drafts back: update_from_output's own

    def before_submit(self, now: float) -> None:
        if not now > self.until_s:  # a run's bound was wrong: not exact
            raise AssertionError(f"{self.engine.name}: a request arrived inside a spec run (before {self.until_s!r} s)")

    def load_drop(self) -> int:
        return 0

    def expect_next_arrival(self, t_s: float) -> None:
        self.next_arrival_s = t_s

    def expect_arrivals_by_load(self, bound: Callable[[int], float] | None) -> None:
        self.arrival_bound = bound

    def defer_runs(self, collides: Callable[[Sequence[float]], int] | None, reads_state: bool = False) -> None:
        pass  # runs are applied when planned (bounded by the router's proof), never deferred

    def planned_kv_usage(self) -> float:
        raise AssertionError("a spec run is never pending")

    def planned_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None,
                              provenance: TokenProvenance | None) -> int:
        raise AssertionError("a spec run is never pending")

    # --- planning ----------------------------------------------------------------------------------
    def advance(self, now: float, in_flight: InFlight) -> list[float] | None:
        """Apply a run of verify steps from this loop-top state, or None (the loop steps)."""
        engine = self.engine
        if (not now < self.next_arrival_s or engine.clients.num_in_frontend or engine.on_finish is not None
                or engine.clients.max_concurrency is not None
                or engine.watchdog.due(engine.book.num_steps + 1, now)):
            return None
        num_in_flight = len(in_flight)
        so_s = in_flight[0][0] if num_in_flight else None
        batch = self.runs.steady_batch(so_s)
        if batch is None:
            return None
        ids = [r.request_id for r in batch]
        join: SpecJoin | None = None
        expected = set(ids)  # the requests S scheduled
        if so_s is not None and self.runs.anyone_joins():  # it joins at schedule 0, or no run
            join = self.runs.joiner(len(batch))
            if join is None:
                return None
            if join.hit is None:  # a running chunk: in S too
                expected.add(join.request.request_id)
        worker = self.sim.batch
        first_k = [worker.num_sampled(rid) for rid in ids]  # each one's next output position
        gains0: list[int] = []
        bumps: list[int] = [0] * len(batch)
        if so_s is not None:  # update 0 applies S: its sampled tokens and drafts
            mro_s = in_flight[0][1]
            drafts_s = so_s.scheduled_spec_decode_tokens
            if set(so_s.num_scheduled_tokens) != expected or mro_s.draft_token_ids is None:
                return None
            for i, r in enumerate(batch):
                rid = r.request_id
                idx = mro_s.req_id_to_index.get(rid)
                got = 0 if idx is None else len(mro_s.sampled_token_ids[idx])
                if not got or rid not in mro_s.draft_token_ids or r.num_output_tokens + got != worker.num_sampled(rid):
                    return None
                gains0.append(got)
                bumps[i] = self.num_spec_tokens - len(drafts_s.get(rid, ()))  # SpecRunPlan.bumps
        if join is not None:
            w = join.request  # from schedule 1 on, as a request with its prefill in flight (bulk/spec_join.py)
            batch.append(w)
            ids.append(w.request_id)
            first_k.append(0)
            gains0.append(0)
            bumps.append(self.num_spec_tokens)
        return self._run(now, in_flight, batch, ids, first_k, gains0, bumps, join)

    def _run(self, now: float, in_flight: InFlight, batch: list[Request], ids: list[str], first_k: list[int],
             gains0: list[int], bumps: list[int], join: SpecJoin | None) -> list[float] | None:
        engine, ns, tokens = self.engine, self.num_spec_tokens, self.sim.batch.tokens
        num_in_flight = len(in_flight)
        later_s, deadline_s = self.next_arrival_s, engine.deadlines.next_s
        bound = self.arrival_bound
        if bound is not None:  # the first arrival the router's proof cannot send elsewhere (constant load)
            later_s = max(later_s, bound(engine.num_outstanding))
        accepted: list[list[int]] = [[] for _ in batch]
        # update j's gain per request (SpecRunPlan): sync, update j applies step j; async, update 0
        # applies the step in flight, update j step j - 1
        gains = [[g0] for g0 in gains0] if num_in_flight else [[] for _ in batch]
        next_k = list(first_k)
        if join is not None:  # its step 0 (the prefill) samples output 0, accepting no draft; update 1 brings it
            accepted[-1].append(0)
            gains[-1].append(1)
            next_k[-1] = 1
        drawing = [True] * len(batch)  # False: drawn past its max_tokens (its stop is in its gains)
        gpu: list[float] = []
        sched_t: list[float] = []
        ends: list[float] = []
        upd_t: list[float] = []
        t, free_at = now, engine.gpu_free_at
        m = self._first_chunk(batch, min(later_s, deadline_s) - max(now, free_at))
        if m < 2:
            return None
        while True:
            for i, rid in enumerate(ids):  # draw steps len(accepted[i]) .. m - 1
                if drawing[i]:
                    self._draw(batch[i], rid, next_k, i, m - len(accepted[i]), num_in_flight, accepted, gains,
                               drawing)
            plan = self.runs.plan(batch, m, gains, bumps, num_in_flight, bound is None, join)
            if join is not None and not gpu:  # step 0, a mixed step: priced and timed alone
                if plan.num_steps < 2:
                    return None
                first = self._first_step(plan, join, t, num_in_flight, later_s, deadline_s, free_at)
                if first is None:
                    return None
                gpu.append(first[0])
                sched_t.append(first[1])
                ends.append(first[2])
                upd_t.append(first[3])
                t, free_at = first[3], first[2]
            # Priced and timed a batch size at a time (the CPU time reads it), none past the piece
            # the cut falls in; the timeline continues exactly across pieces (timeline.py).
            sizes, sums = plan.step_sums(len(gpu))
            a, cut = 0, False
            while a < len(sizes):
                n, b = sizes[a], a + 1
                while b < len(sizes) and sizes[b] == n:
                    b += 1
                piece = self._prices(plan, len(gpu), n, sums[a:b])
                gpu += piece
                s, e, u = step_timeline(t, piece, num_in_flight, engine.cpu.step_s(n, n * (1 + ns)), later_s,
                                        deadline_s, free_at)
                sched_t += s
                ends += e
                upd_t += u
                if s:
                    t, free_at = u[-1], e[-1]
                if len(s) < b - a:
                    cut = True
                    break
                a = b
            if cut or plan.num_steps < m or m >= MAX_SPEC_STEPS:
                break
            m = self._next_chunk(m, min(later_s, deadline_s) - t, gpu[-1], sizes[-1])
        k = len(sched_t)
        if k < 2:
            return None
        tail: Tail | None = None
        if cut and num_in_flight and t < deadline_s and not engine.watchdog.due(engine.book.num_steps + k + 1, t):
            # The update after schedule k meets the arrival, not schedule k itself: the loop schedules
            # it at t, the last update's time, before the arrival; the run does too (its tail).
            tail = self._tail(plan.batch_at(k), gpu[k], t, free_at)
        plan.cut(k)
        return exact_delays(now, self._apply(in_flight, plan, accepted, (first_k, next_k), gpu[:k],
                                             (sched_t, ends, upd_t), tail))

    def _tail(self, rows: list[int], gpu_s: float, t: float, free_at: float) -> Tail:
        """The tail (batch `rows`, priced gpu_s), scheduled at t with the GPU free at free_at."""
        n = len(rows)
        start = t + self.engine.cpu.step_s(n, n * (1 + self.num_spec_tokens))
        if free_at > start:  # the loop's max(now + cpu_s, GPU free)
            start = free_at
        return Tail(rows, gpu_s, start + gpu_s)

    def _first_step(self, plan: SpecRunPlan, join: SpecJoin, t: float, num_in_flight: int, later_s: float,
                    deadline_s: float, free_at: float) -> tuple[float, float, float, float] | None:
        """(GPU time, schedule time, GPU end, update time) of a run's step 0 where a prompt joins it:
        the verifies on their contexts, then its prefill on its hit, as execute() prices that
        mixed step and the loop times it (its own CPU time); None where it does not fit."""
        ns = self.num_spec_tokens
        rows = plan.batch_at(0)
        new = [1 + ns] * (len(rows) - 1)
        new.append(join.num_prefill_tokens)
        gpu_s = self.sim.mixed_step_time_s(new, [plan.ctx[i][0] for i in rows])
        num_tokens = (len(rows) - 1) * (1 + ns) + join.num_prefill_tokens
        s, e, u = step_timeline(t, [gpu_s], num_in_flight, self.engine.cpu.step_s(len(rows), num_tokens), later_s,
                                deadline_s, free_at)
        return (gpu_s, s[0], e[0], u[0]) if s else None

    def _first_chunk(self, batch: list[Request], horizon_s: float) -> int:
        """How many steps to draw first: about as many as fit in horizon_s (to the next arrival or
        deadline), each taking about the GPU time of a verify step of the batch as it is now (or
        its CPU time, if longer); 0 when not even two do. Only the work depends on it: a chunk
        cut short or too long gives the same run, and a run not tried is stepped."""
        if horizon_s == math.inf:
            return FIRST_CHUNK_STEPS
        n, ns = len(batch), self.num_spec_tokens
        shape = StepShape((1 + ns,) * n, tuple([r.num_computed_tokens for r in batch]), n, ())
        period_s = max(self.sim.cost_model.step_time_s(shape), self.engine.cpu.step_s(n, n * (1 + ns)))
        if not period_s > 0:
            return FIRST_CHUNK_STEPS
        if horizon_s < period_s:
            return 0  # not even the second update fits (the step before an arrival): step it
        return min(MAX_SPEC_STEPS, int(horizon_s / period_s) + 2)

    def _next_chunk(self, m: int, horizon_s: float, last_gpu_s: float, n: int) -> int:
        """How many steps to have drawn next, m drawn and all fitting: about as many more as fit in
        horizon_s (what is left to the next arrival or deadline), each taking the last step's time
        (finishes shrink the batch, so steps get shorter than the first chunk assumed); doubling
        when nothing bounds the run. Only the work depends on it (as _first_chunk)."""
        period_s = max(last_gpu_s, self.engine.cpu.step_s(n, n * (1 + self.num_spec_tokens)))
        if horizon_s == math.inf or not period_s > 0:
            return min(2 * m, MAX_SPEC_STEPS)
        return min(MAX_SPEC_STEPS, m + max(2, int(horizon_s / period_s) + 2))

    def _draw(self, r: Request, rid: str, next_k: list[int], i: int, num_steps: int, num_in_flight: int,
              accepted: list[list[int]], gains: list[list[int]], drawing: list[bool]) -> None:
        """Draw batch[i]'s next num_steps verify steps (their acceptances and gains), or
        fewer: none starts at its max_tokens or later (its update stops it before), and async, the
        step scheduled before the update that stops it (sampled, its tokens dropped) is drawn
        too; then it draws no more (drawing[i])."""
        ns, tokens = self.num_spec_tokens, self.sim.batch.tokens
        more = tokens.accepted_run(rid, next_k[i], num_steps, ns, r.max_tokens)
        k = next_k[i]
        drawn = gains[i]
        for a in more:  # each step's gain, and the next one's first output
            drawn.append(1 + a)
            k += 1 + a
        if len(more) < num_steps:
            drawing[i] = False
            if num_in_flight:
                last = tokens.accepted_run(rid, k, 1, ns, k + 1)[0]
                more.append(last)
                drawn.append(1 + last)
                k += 1 + last
        accepted[i] += more
        next_k[i] = k

    def _prices(self, plan: SpecRunPlan, first: int, n: int, ctx_sums: list[int]) -> list[float]:
        """GPU times of steps first, first + 1, ... of the plan, each of n requests, their contexts
        summing to ctx_sums: in bulk (SimExecutor.verify_step_times_s) where the cost model can,
        else step by step on each exact StepShape (_price)."""
        times = self.sim.verify_step_times_s(1 + self.num_spec_tokens, n, ctx_sums)
        if times is not None:
            return times
        return [self._price(plan, plan.batch_at(j), j) for j in range(first, first + len(ctx_sums))]

    def _price(self, plan: SpecRunPlan, rows: list[int], j: int) -> float:
        """GPU time of step j (batch `rows`): SimExecutor.execute's float on its StepShape (1 +
        num_spec_tokens new tokens per request on its context; every request samples)."""
        sim = self.sim
        n = len(rows)
        extra_s = sim.sampler.seconds(n) if sim.sampler is not None else 0.0
        ctx = plan.ctx
        return sim.cost_model.step_time_s(StepShape((1 + self.num_spec_tokens,) * n,
                                                    tuple([ctx[i][j] for i in rows]), n, ())) + extra_s

    # --- applying ------------------------------------------------------------------------------------
    def _apply(self, in_flight: InFlight, plan: SpecRunPlan, accepted: list[list[int]],
               drawn: tuple[list[int], list[int]], gpu: list[float], tl: tuple[list[float], list[float], list[float]],
               tail: Tail | None) -> float:
        """Apply the planned run (its num_steps steps, and its tail) as stepping would; returns the
        last update's time. drawn: each request's first output position before the run and after
        its drawn steps (_positions)."""
        engine, sim, runs, ns = self.engine, self.sim, self.runs, self.num_spec_tokens
        book = engine.book
        sched_t, ends, upd_t = tl
        k, batch = plan.num_steps, plan.batch
        ids = [r.request_id for r in batch]
        tokens = sim.batch.tokens
        async_ = bool(in_flight)
        sim.forget(runs.finished_req_ids())  # the run's first schedule hands them to the worker
        if plan.join is not None and plan.join.hit is None:
            self.num_chunks_joined += 1
        elif plan.join is not None:  # schedule 0 admits it (as execute() learns a step's new request)
            w = plan.join.request
            sim.admit_joined(w.request_id, w.num_prompt_tokens)
            record = book.metrics.requests[w.request_id]
            if record.first_scheduled_s is None:
                record.first_scheduled_s = sched_t[0]
            self.num_joined += 1
        positions, sampled = _positions(plan, accepted, drawn, set(tail.rows) if tail is not None else set())
        sim.batch.sample_verify_run(ids, sampled)
        # drafts after the run's last update: proposed after step k - 2's tokens (async) or k - 1's
        final = [tokens.drafts(rid, pos[1] if async_ else pos[2], ns) if m == k else []
                 for rid, pos, m in zip(ids, positions, plan.steps_each)]
        free_after = runs.apply(plan, tokens, len(in_flight), upd_t, final, tail.rows if tail is not None else (),
                                sched_t[0])
        hits0, queries0 = runs.prefix_stats_taken()  # (a joiner's lookup at schedule 0 among them)
        finishes = sorted((f, i) for i, f in enumerate(plan.finish_at) if f is not None)
        self.recorder.token_times(plan, upd_t)
        for f, i in finishes:  # each update's finishes after its tokens, in batch order
            r = batch[i]
            engine.record_finish(r.request_id, upd_t[f], r.get_finished_reason(), r.num_cached_tokens or 0)
        # handed over by the run's later schedules (the tail's hands over the last update's too)
        sim.forget({ids[i] for f, i in finishes if f < k - 1 or tail is not None})
        self.recorder.rows(plan, in_flight, gpu, (sched_t, upd_t), free_after, (hits0, queries0),
                           [f for f, _ in finishes])
        book.num_steps += k
        book.arrived_since_step = []
        engine.mark_progress(upd_t[-1])
        last = plan.batch_at(k - 1)
        sim.last_shape = StepShape((1 + ns,) * len(last), tuple([plan.ctx[i][k - 1] for i in last]), len(last), ())
        engine.gpu_free_at = ends[-1]
        if async_:
            in_flight.popleft()
            in_flight.append(self._in_flight(plan, ids, positions, accepted, k - 1, last, ends[-1],
                                             len(book.metrics.steps) - 1))
        if tail is not None:
            self.recorder.tail_row(len(tail.rows), tail.gpu_s, upd_t[-1], free_after[k])
            sim.last_shape = StepShape((1 + ns,) * len(tail.rows), tuple([plan.ctx[i][k] for i in tail.rows]),
                                       len(tail.rows), ())
            in_flight.append(self._in_flight(plan, ids, positions, accepted, k, tail.rows, tail.end_s,
                                             len(book.metrics.steps) - 1))
            engine.gpu_free_at = tail.end_s
        self.until_s = upd_t[-1]
        self.num_macro_steps += k + (tail is not None)
        self.num_macro_runs += 1
        self.num_bulk_finishes += len(finishes)
        return upd_t[-1]

    def _in_flight(self, plan: SpecRunPlan, ids: list[str], positions: list[list[int]], accepted: list[list[int]],
                   j: int, rows: list[int], end_s: float, row: int) -> tuple[SchedulerOutput, ModelRunnerOutput,
                                                                        float, None, int]:
        """The loop's in-flight entry of the run's step j (batch `rows`; j is k - 1 or k, the
        positions' first being step k - 2's): its SchedulerOutput (the drafts update j - 1 gave:
        proposed after step j - 2's tokens), its sampled tokens and drafts, its GPU end and its
        steps row."""
        ns, tokens = self.num_spec_tokens, self.sim.batch.tokens
        at = j - plan.num_steps + 2  # step j's index into positions[i]
        step_ids = [ids[i] for i in rows]
        verified: list[list[int]] = []
        sampled: list[list[int]] = []
        drafts: dict[str, list[int]] = {}
        for i in rows:
            # the drafts it verifies (outputs from step j - 1's next), its outputs and the drafts
            # proposed after them (the outputs after those) are one stretch of its output ids
            p0, p1 = positions[i][at - 1], positions[i][at]
            p2 = p1 + 1 + accepted[i][j]
            out = tokens.tokens(ids[i], p0, p2 + ns - p0)
            verified.append(out[:ns])
            sampled.append(out[p1 - p0:p2 - p0])
            drafts[ids[i]] = out[p2 - p0:]
        so = self.runs.verify_step_output(step_ids, verified)
        mro = ModelRunnerOutput(step_ids, {rid: x for x, rid in enumerate(step_ids)}, sampled, drafts)
        return so, mro, end_s, None, row


def _positions(plan: SpecRunPlan, accepted: list[list[int]], drawn: tuple[list[int], list[int]],
               in_tail: set[int]) -> tuple[list[list[int]], list[int]]:
    """(positions, sampled): positions[i][j - (k - 2)] is batch[i]'s first new output of step j
    (the worker's count then), for k - 2 <= j <= its steps (what the last steps' outputs read; a
    request done sooner keeps one: its count after its steps); sampled[i], the outputs its
    steps (and the tail's) sample. drawn: each one's first output position before the run and
    after its drawn steps, so a walk back over the steps drawn past its last (a few) finds it."""
    k = plan.num_steps
    first_k, next_k = drawn
    positions: list[list[int]] = []
    sampled: list[int] = []
    for i, (k0, acc, m, p) in enumerate(zip(first_k, accepted, plan.steps_each, next_k)):
        if i in in_tail:
            m += 1  # the tail's step samples it too
        for j in range(m, len(acc)):
            p -= 1 + acc[j]
        sampled.append(p - k0)
        pos = [p]
        for j in range(m - 1, k - 3, -1):  # back to step k - 2's
            p -= 1 + acc[j]
            pos.append(p)
        pos.reverse()
        positions.append(pos)
    return positions, sampled


def spec_planner_for(engine: Engine, sim: SimExecutor) -> tuple[SpecPlanner | None, str | None]:
    """The spec-decode fast path for a vLLM engine (planner, None) or why there is none (None, why)."""
    runs = VllmSpecRuns(engine.scheduler)  # type: ignore[arg-type]
    why = runs.spec_run_blocker()
    if why is not None:
        return None, why
    return SpecPlanner(engine, runs, sim), None
