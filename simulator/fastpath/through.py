"""Async runs through finishes: a single engine's run goes on past the update that finishes a request.

Without this, a run ends before the update of a request's last step (decode_run_horizon bounds it
by max_tokens), and the next run starts with that update stepped (`update_from_output`, its
metrics), its own first schedule and its own planning: ~54 % of the Azure hour's runs ended so.
With one step in flight and nothing waiting, the async loop's state after such an update is
provably the old batch minus the finished requests: vLLM's skip-ahead passes a request over once
its last step is scheduled, that step's update finishes it, and with nothing waiting the freed
seat and blocks admit nobody. So the run is planned with the batch shrinking at known steps
(DecodeRuns.decode_run_steps: request i takes the run's first each[i] schedules), and each
component applies its part in bulk: the scheduler's bulk owner (steps_each) appends the last
token, caches, checks the stop rule and frees the request through the scheduler's own free at
that update, in update_from_output's order; the executor samples each request's own number of
tokens; RunClock.plan_through prices and times the run segment by segment (a segment: steps of one
batch); these functions write the step rows (batch size and running count per step) and record
each finish as Engine.apply_output would (its token time, finish time and reason).

Only where nothing outside hears of a finish before the run is applied: a single engine with no
max_concurrency (MacroPlanner._finishes_stay_inside), or a cluster replica's deferred run, whose
load the router reads as it falls at each finishing update (fastpath/deferred.py); the eager
cluster path, whose router proof reads a constant load, stops at finishes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from servesim.scheduler.request import Request
from servesim.simulator.engine import Engine
from servesim.simulator.step_book import PROGRESS_EVERY_STEPS, StepBook

if TYPE_CHECKING:
    from servesim.simulator.fastpath.runs import RunApplier


def through_rows(applier: RunApplier, first_step: int, each: list[int], scheduled: list[int],
                 sched_t: list[float], upd_t: list[float], gpu: list[float], free_after: list[int],
                 hits: list[int], queries: list[int]) -> None:
    """The step rows of a run's steps 1..k-1 (k = len(sched_t); step 0's row is written before
    the run's first update), numbered from first_step, as RunApplier.rows writes them but with
    each step's own batch size and running count: a request whose last step is m (each[i] = m <
    k) is counted running up to schedule m and finished by update m; `scheduled`: the steps that
    schedule each request (RunClock.scheduled_each). `free_after`, `hits`, `queries` are the bulk
    schedule's (their index i is step i + 1)."""
    k = len(sched_t)
    runs, book = applier.runs, applier.engine.book
    running_end, waiting = applier.engine.scheduler.get_request_counts()  # the finishers are gone
    fin = sorted([m for m in each if m < k])  # running at step j: each[i] >= j (finished by update each[i])
    sched = sorted([m for m in scheduled if m < k])  # step j's batch: scheduled[i] > j
    cuts = sorted({c for m in fin + sched for c in (m, m + 1) if 1 < c < k} | {1, k})
    sizes: list[int] = []
    running: list[int] = []
    total, num_fin = len(each), len(fin)
    for a, b in zip(cuts, cuts[1:]):  # steps of one batch size and running count
        sizes += [total - bisect_right(sched, a)] * (b - a)
        running += [running_end + num_fin - bisect_left(fin, a)] * (b - a)
    hits_ext, queries_ext = hits + [0], queries + [0]  # the last step's update is the next run's
    durations = [upd_t[j + 1] - sched_t[j] for j in range(1, k - 1)]
    book.metrics.steps.extend_decode_run(first_step, sched_t[1:], durations, gpu[1:k], sizes,
                                         runs.usages_at(free_after), running, waiting,
                                         hits_ext[1:], queries_ext[1:])
    book.prefix_hits += sum(h for h in hits_ext[1:])  # step 0's (hits[0]) the caller adds with its row
    book.prefix_queries += sum(q for q in queries_ext[1:])


def through_metrics(engine: Engine, reqs: list[Request], each: list[int], upd_t: list[float]) -> list[int]:
    """Token times of a run's updates 1..k-1 (k = len(upd_t)) and the finishes among them, as
    Engine.apply_output records them (a finisher's last token, then its finish at that update's
    time); returns the finishing updates' indices into upd_t[1:], ascending."""
    k = len(upd_t)
    engine.book.metrics.on_decode_run([r.request_id for r in reqs], upd_t[1:], [min(m, k - 1) for m in each])
    done: list[int] = []
    for m, i in sorted((m, i) for i, m in enumerate(each) if m < k):  # update order, then batch order
        r = reqs[i]
        engine.record_finish(r.request_id, upd_t[m], r.get_finished_reason(), r.num_cached_tokens or 0)
        done.append(m - 1)
    return done


def progress_through(book: StepBook, first_num_steps: int, update_times: list[float], finish_at: list[int]) -> None:
    """RunApplier.progress when some of the updates finished requests (finish_at: their indices
    into update_times, ascending): each call reads the requests done by then."""
    if book.progress is None:
        return
    base = book.num_done - len(finish_at)
    for j, t in enumerate(update_times):
        if (first_num_steps + j) % PROGRESS_EVERY_STEPS == 0:
            book.progress(t, base + bisect_right(finish_at, j))
