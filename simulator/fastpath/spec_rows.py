"""A spec run's bookkeeping (simulator/fastpath/spec_runs.py): the step rows, the tail's row, the
progress callback and each update's token times, written as the stepping loop's StepBook and
MetricsRecorder write them step by step."""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from typing import cast

from servesim.scheduler.bulk.spec import VllmSpecRuns
from servesim.scheduler.bulk.spec_plan import SpecRunPlan
from servesim.simulator.engine import Engine, InFlight
from servesim.simulator.step_book import PROGRESS_EVERY_STEPS


class SpecRunRecorder:
    """Writes an applied spec run into one engine's book (a SpecPlanner owns one)."""

    def __init__(self, engine: Engine, runs: VllmSpecRuns) -> None:
        self.engine = engine
        self.runs = runs
        self.num_spec_tokens = engine.cfg.scheduler.num_spec_tokens

    def tail_row(self, n: int, gpu_s: float, t: float, num_free_blocks: int) -> None:
        """An async run's tail step's row (n requests, priced gpu_s, scheduled at t), as
        StepBook.record_schedule writes it (its update completes it later)."""
        book = self.engine.book
        running, waiting = self.engine.scheduler.get_request_counts()
        row = book.metrics.steps.append(book.num_steps, t, n, 0, n * (1 + self.num_spec_tokens),
                                        self.runs.usages_at([num_free_blocks])[0], running, waiting, 0)
        book.metrics.steps.set_gpu_time(row, gpu_s)
        book.num_steps += 1

    def rows(self, plan: SpecRunPlan, in_flight: InFlight, gpu: list[float], times: tuple[list[float], list[float]],
             free_after: list[int], stats0: tuple[int, int], finish_updates: list[int]) -> None:
        """The steps' rows as StepBook.record_schedule / record_update write them (counts after each
        schedule; the update completes a row: sync its own, async the previous step's), the
        in-flight step's row completed by update 0, and the progress callback at the updates it
        runs at (the requests done by then: finish_updates, ascending, are the run's finishes).
        times: (schedule times, update times); stats0: the prefix stats update 0 takes."""
        engine, ns = self.engine, self.num_spec_tokens
        sched_t, upd_t = times
        hits0, queries0 = stats0
        book = engine.book
        steps = book.metrics.steps
        k = plan.num_steps
        running_end, waiting = engine.scheduler.get_request_counts()
        usages = self.runs.usages_at(free_after)
        base = book.num_steps
        # step j's batch: the requests scheduled more than j times; running at j: those not stopped before j
        sizes = _num_above(sorted(plan.steps_each), k, 0)
        running = _num_above(finish_updates, k, -1)
        running = [running_end + n for n in running]
        zeros = [0] * k
        # update j completes one row: async, the step before j (the in-flight step's at update 0,
        # this run's last row still to come); sync, its own
        if in_flight:
            steps.set_update(in_flight[0][4], upd_t[0], hits0, queries0)
            durations = [upd_t[j + 1] - sched_t[j] for j in range(k - 1)]
            hits, queries = zeros, zeros
        else:
            durations = [upd_t[j] - sched_t[j] for j in range(k)]
            hits, queries = [hits0, *zeros[1:]], [queries0, *zeros[1:]]
        decode = [n * (1 + ns) for n in sizes]
        prefill: list[int] | None = None
        if plan.join is not None:  # step 0 computes the joiner's prompt past its hit
            decode[0] -= 1 + ns
            prefill = [0] * k
            prefill[0] = plan.join.num_prefill_tokens
        steps.extend_decode_run(base, sched_t[:k], durations, gpu[:k], sizes, usages[:k], running, waiting, hits,
                                queries, num_decode_tokens=decode, num_prefill_tokens=prefill)
        book.prefix_hits += hits0
        book.prefix_queries += queries0
        if book.progress is not None:
            done_before = book.num_done - len(finish_updates)
            for j in range(k):
                if (base + j + 1) % PROGRESS_EVERY_STEPS == 0:  # update j runs after schedule j
                    book.progress(upd_t[j], done_before + bisect_right(finish_updates, j))

    def token_times(self, plan: SpecRunPlan, upd_t: list[float]) -> None:
        """Each update's tokens at its time (MetricsRecorder.on_step_outputs, update by update; a
        request's last update brings its tokens up to max_tokens only)."""
        records = self.engine.book.metrics.requests
        k = plan.num_steps
        # Every token's time as the float object upd_t holds (a reference appended, no float boxed
        # per token), converted in one struct call a run (array's own conversion parses each item
        # as a format argument); each request's then one slice concatenated, as on_decode_run.
        at = cast("list[object]", upd_t)
        times: list[object] = []
        ends: list[int] = []
        for r, g, f in zip(plan.batch, plan.gains, plan.finish_at):
            rec = records[r.request_id]
            start = len(times)
            for j in range(k if f is None else f):
                t = at[j]
                for _token in range(g[j]):
                    times.append(t)
            if f is not None:  # its last update brings its tokens up to max_tokens only
                times += [at[f]] * (r.num_output_tokens - len(rec.token_times_s) - (len(times) - start))
            ends.append(len(times))
            if rec.first_token_s is None:  # (a joiner's first token comes with update 1)
                rec.first_token_s = upd_t[0] if g[0] else upd_t[1]
        packed = array("d")
        packed.frombytes(struct.pack(f"{len(times)}d", *times))
        start = 0
        for r, end in zip(plan.batch, ends):
            records[r.request_id].token_times_s += packed[start:end]
            start = end


def _num_above(ascending: list[int], k: int, below: int) -> list[int]:
    """For each j < k, how many of `ascending` exceed j + below (a walk: no bisect call a step)."""
    n, p = len(ascending), 0
    out: list[int] = []
    for j in range(k):
        while p < n and ascending[p] <= j + below:
            p += 1
        out.append(n - p)
    return out
