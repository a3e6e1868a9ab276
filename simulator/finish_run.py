"""Async runs through finishes: a single engine's run goes on past the update that finishes a request.

Without this, a run ends before the update of a request's last step (decode_run_horizon bounds it
by max_tokens), and the next run starts with that update stepped (`update_from_output`, its
metrics), its own first schedule and its own planning: ~54 % of the Azure hour's runs ended so.
With one step in flight and nothing waiting, the async loop's state after such an update is
provably the old batch minus the finished requests: vLLM's skip-ahead passes a request over once
its last step is scheduled, that step's update finishes it, and with nothing waiting the freed
seat and blocks admit nobody. So the run is planned with the batch shrinking at known steps
(the bulk path's decode_run_steps, scheduler/bulk/vllm.py: request i takes the run's first each[i] schedules), and each
component applies its part in bulk: the bulk path's schedule_decode_steps (steps_each) appends the
last token, caches, checks the stop rule and frees the request through its own _free_request at
that update, in update_from_output's order (KVDecodeRuns.apply_decode_run calls it back among
its sorted events); the executor samples each request's own number of tokens; this mixin prices
and times the run segment by segment (a segment: steps of one batch; the stepping loop's float
arithmetic continues across them), writes the step rows (batch size and running count per step)
and records each finish as Engine._on_update would (its token time, finish time and reason).

Only where nothing outside hears of a finish before the run is applied: a single engine with no
max_concurrency (_finishes_stay_inside), or a cluster replica's deferred run, whose load the router
reads as it falls at each finishing update (deferred_run.py); the eager cluster path, whose
router proof reads a constant load, stops at finishes as before. Mixed into MacroStepMixin.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from servesim.scheduler.request import Request
from servesim.simulator.engine_rank import EngineRankMixin

if TYPE_CHECKING:
    from servesim.simulator.engine import Engine

Timeline = tuple[list[float], list[float], list[float]]  # (schedule times, GPU ends, update times) of a run's steps


class FinishRunMixin(EngineRankMixin):
    """Planning and bookkeeping of runs whose batch shrinks at finishes (module docstring)."""

    def _plan_through(self: Engine, now: float, ctx0: list[int], each: list[int], k: int, later_s: float,
                      first_step: int = 0, free_at: float | None = None,
                      priced: list[float] | None = None) -> tuple[list[float], Timeline]:
        """Price and time steps first_step..k-1 (gpu, (schedule times, GPU ends, update times)) of
        a run whose batch shrinks (step j's batch: each[i] > j). Piece by piece: a piece is one
        batch's steps, up to 16, 64, 256, ... steps in all as in _macro_step, priced in one call (a
        step's price does not depend on the grouping) and timed by _macro_timeline continuing from
        the previous piece's last update and GPU end, exactly as the stepping loop's next iteration
        (the CPU time of a step reads its batch size; the floats do not depend on where the
        timeline is split); stops at the first piece cut short. A run growing (deferred_run.py)
        continues from its last update `now`, where the GPU frees at `free_at`. `priced`: the
        steps' prices are known (priced[j] for step j): they are only timed, a batch at a time."""
        gpu: list[float] = []
        sched_t: list[float] = []
        ends: list[float] = []
        upd_t: list[float] = []
        t, a = now, first_step
        scheduled = self._scheduled_each(each)  # batch membership: the steps that schedule a request
        assert scheduled is not None
        fin = sorted([m for m in scheduled if m < k])  # the steps where the batch changes
        while a < k:
            c = bisect_right(fin, a)
            b = fin[c] if c < len(fin) else k
            if priced is None:
                b = min(b, max(16, 4 * a))
                batch_ctx = [ctx + a for ctx, m in zip(ctx0, scheduled) if m > a]
                piece, n = self._sim_executor().decode_step_times_s(batch_ctx, b - a), len(batch_ctx)
            else:
                piece, n = priced[a:b], sum([1 for m in scheduled if m > a])
            gpu += piece
            s, e, u = self._macro_timeline(t, piece, 1, n, later_s, free_at)
            sched_t += s
            ends += e
            upd_t += u
            if len(s) < b - a:
                break
            t, free_at, a = u[-1], e[-1], b
        return gpu, (sched_t, ends, upd_t)

    def _through_rows(self: Engine, first_step: int, each: list[int], sched_t: list[float], upd_t: list[float],
                      gpu: list[float], free_after: list[int], hits: list[int], queries: list[int]) -> None:
        """The step rows of a run's steps 1..k-1 (k = len(sched_t); step 0's row is written before
        the run's first update), numbered from first_step, as _macro_rows writes them but with
        each step's own batch size and running count: a request whose last step is m (each[i]
        = m < k) is counted running up to schedule m and finished by update m. `free_after`,
        `hits`, `queries` are schedule_decode_steps' (their index i is step i + 1)."""
        k = len(sched_t)
        running_end, waiting = self.scheduler.get_request_counts()  # the finishers are gone
        fin = sorted([m for m in each if m < k])  # running at step j: each[i] >= j (finished by update each[i])
        scheduled = self._scheduled_each(each)
        assert scheduled is not None
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
        self.metrics.steps.extend_decode_run(first_step, sched_t[1:], durations, gpu[1:k], sizes,
                                             self._runs().usages_at(free_after), running, waiting,
                                             hits_ext[1:], queries_ext[1:])
        self.prefix_hits += sum(hits_ext[1:])  # step 0's (hits[0]) the caller adds with its row
        self.prefix_queries += sum(queries_ext[1:])

    def _through_metrics(self: Engine, reqs: list[Request], each: list[int], upd_t: list[float]) -> list[int]:
        """Token times of a run's updates 1..k-1 (k = len(upd_t)) and the finishes among them, as
        _on_update records them (a finisher's last token, then its finish at that update's
        time); returns the finishing updates' indices into upd_t[1:], ascending."""
        k = len(upd_t)
        self.metrics.on_decode_run([r.request_id for r in reqs], upd_t[1:], [min(m, k - 1) for m in each])
        done: list[int] = []
        for m, i in sorted((m, i) for i, m in enumerate(each) if m < k):  # update order, then batch order
            r = reqs[i]
            self._finished(r.request_id, upd_t[m], r.get_finished_reason(), r.num_cached_tokens or 0)
            done.append(m - 1)
        self.num_bulk_finishes += len(done)
        return done

    def _progress_through(self: Engine, first_num_steps: int, update_times: list[float], finish_at: list[int]) -> None:
        """_macro_progress when some of the updates finished requests (finish_at: their indices
        into update_times, ascending): each call reads the requests done by then."""
        if self.progress is None:
            return
        base = self._num_done - len(finish_at)
        for j, t in enumerate(update_times):
            if (first_num_steps + j) % 256 == 0:
                self.progress(t, base + bisect_right(finish_at, j))
