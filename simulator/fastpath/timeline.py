"""A run's clock: its steps' prices and their schedule, GPU-end and update times, with the
stepping loop's exact float arithmetic.

The stepping loop (Engine._engine_loop) computes, for each step, start = max(now + cpu, GPU free),
end = start + gpu, and the clock reaches the end as now + (end - now) (SimPy's timeout). A run's
timeline repeats that arithmetic in one compiled call (kernels.step_timeline), so every float a
run writes is the float stepping would have written. The floats do not depend on where a timeline
is split: a timeline continued from its last update and GPU end gives the same steps.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from servesim.scheduler.bulk.interface import Joins
from servesim.scheduler.request import Request
from servesim.simulator.engine import Engine
from servesim.simulator.executor import SimExecutor
from servesim.simulator.kernels import step_timeline

Timeline = tuple[list[float], list[float], list[float]]  # (schedule times, GPU ends, update times) of a run's steps


@dataclass(slots=True)
class FirstStep:
    """A run's first step where a prompt joins it (DecodeRuns.decode_run_joining): a mixed step,
    its GPU and CPU seconds the ones stepping computes for it (not a decode step's)."""

    gpu_s: float
    cpu_s: float


def exact_delays(now: float, t: float) -> list[float]:
    """Delays whose SimPy timeouts, one after the other, bring the clock from now to exactly t (a
    timeout lands at now + delay, rounded). One hop suffices when t <= 2 now (Sterbenz: t - now is
    exact, so is the sum); otherwise now + (t - now) can round past t (a tie rounds to even), so
    hop first to y ~ 0.75 t, whatever it rounds to: from y >= t / 2 the second hop is exact."""
    d = t - now
    if now + d == t:
        return [d]
    first = 0.75 * t - now
    y = now + first  # where the first timeout lands
    assert t / 2 <= y <= t and y + (t - y) == t
    return [first, t - y]


def batch_at(reqs: list[Request], scheduled: list[int] | None, j: int) -> list[Request]:
    """The requests step j of a run schedules, reqs[i] being scheduled in its first scheduled[i]
    steps (None: all of them in every step)."""
    return reqs if scheduled is None else [r for r, m in zip(reqs, scheduled) if m > j]


class RunClock:
    """Prices (the simulated executor's cost model) and times (the engine's CPU overhead, GPU-free
    time and client deadlines) the steps of a run."""

    def __init__(self, engine: Engine, sim: SimExecutor, extra_steps: int) -> None:
        self.engine = engine
        self.sim = sim
        # Steps a request is still scheduled after the one that brings its last token, in a run
        # through finishes (DecodeRuns.decode_run_extra_steps: SGLang's extra forward).
        self.extra_steps = extra_steps

    def scheduled_each(self, each: list[int] | None) -> list[int] | None:
        """How many of a run's steps schedule each request, from how many bring it a token
        (`each`): SGLang's overlap schedules a finishing request once more (the extra forward);
        vLLM's skip-ahead does not."""
        x = self.extra_steps
        return each if each is None or x == 0 else [m + x for m in each]

    def first_step(self, ctx0: list[int], joins: Joins) -> FirstStep | None:
        """The price of a run's first schedule where a prompt joins it: the batch's decodes on
        their contexts (ctx0, the joining requests' last) and each joining request's tokens on
        its prefix hit, in scheduling order, as the stepping loop prices it (the executor's
        step time, the CPU model's time for its requests and tokens); None where the decode
        step's price holds (nobody joins, or each computes one token)."""
        if not joins.prompt_tokens():
            return None
        m = len(ctx0) - len(joins.requests)
        new = [1] * m + joins.num_new_tokens
        return FirstStep(self.sim.mixed_step_time_s(new, ctx0[:m] + joins.contexts),
                         self.engine.cpu.step_s(len(new), sum(n for n in new)))

    def deadline_s(self) -> float:
        """The first pending client deadline (inf: none): every schedule of a run precedes it."""
        return self.engine.deadlines.next_s

    def timeline(self, now: float, gpu: list[float], num_in_flight: int, n: int, later_s: float,
                 free_at: float | None = None, first_cpu_s: float | None = None) -> Timeline:
        """(schedule times, GPU end times, update times) of the steps of n requests priced `gpu`
        that fit before any outside event: the update after schedule j is step j's own (sync) or
        the previous one's (async); every update precedes `later_s` (the next arrival, or the
        first one a router cannot prove goes elsewhere) and every schedule the first client
        deadline. `free_at` (default: the engine's GPU-free time) continues a timeline from its
        last update at `now`, where the GPU frees at its last end (a deferred run growing).
        `first_cpu_s`: the first step's CPU time where it is not a decode step's (FirstStep): it
        is timed alone and the rest continue from it."""
        engine = self.engine
        free = engine.gpu_free_at if free_at is None else free_at
        cpu_s, deadline_s = engine.cpu.step_s(n, n), self.deadline_s()
        if first_cpu_s is None or not gpu:
            return step_timeline(now, gpu, num_in_flight, cpu_s, later_s, deadline_s, free)
        s, e, u = step_timeline(now, gpu[:1], num_in_flight, first_cpu_s, later_s, deadline_s, free)
        if not s or len(gpu) == 1:
            return s, e, u
        s2, e2, u2 = step_timeline(u[0], gpu[1:], num_in_flight, cpu_s, later_s, deadline_s, e[0])
        return s + s2, e + e2, u + u2

    def plan_through(self, now: float, ctx0: list[int], each: list[int], k: int, later_s: float,
                     first_step: int = 0, free_at: float | None = None,
                     priced: list[float] | None = None, first: FirstStep | None = None) -> tuple[list[float], Timeline]:
        """Price and time steps first_step..k-1 (gpu, (schedule times, GPU ends, update times)) of
        a run whose batch shrinks (step j's batch: each[i] > j; simulator/fastpath/through.py).
        Piece by piece: a piece is one batch's steps, up to 16, 64, 256, ... steps in all, priced
        in one call (a step's price does not depend on the grouping) and timed continuing from the
        previous piece's last update and GPU end, exactly as the stepping loop's next iteration
        (the CPU time of a step reads its batch size); stops at the first piece cut short. A run
        growing (fastpath/deferred.py) continues from its last update `now`, where the GPU frees
        at `free_at`. `priced`: the steps' prices are known (priced[j] for step j): they are only
        timed, a batch at a time. `first`: step 0's price where a prompt joins it."""
        gpu: list[float] = []
        sched_t: list[float] = []
        ends: list[float] = []
        upd_t: list[float] = []
        t, a = now, first_step
        scheduled = self.scheduled_each(each)  # batch membership: the steps that schedule a request
        assert scheduled is not None
        fin = sorted([m for m in scheduled if m < k])  # the steps where the batch changes
        while a < k:
            c = bisect_right(fin, a)
            b = fin[c] if c < len(fin) else k
            if priced is None:
                b = min(b, max(16, 4 * a))
                batch_ctx = [ctx + a for ctx, m in zip(ctx0, scheduled) if m > a]
                piece, n = self.sim.decode_step_times_s(batch_ctx, b - a), len(batch_ctx)
                if a == 0 and first is not None:
                    piece[0] = first.gpu_s
            else:
                piece, n = priced[a:b], sum(1 for m in scheduled if m > a)
            gpu += piece
            s, e, u = self.timeline(t, piece, 1, n, later_s, free_at,
                                    first.cpu_s if a == 0 and first is not None else None)
            sched_t += s
            ends += e
            upd_t += u
            if len(s) < b - a:
                break
            t, free_at, a = u[-1], e[-1], b
        return gpu, (sched_t, ends, upd_t)
