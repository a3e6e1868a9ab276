"""A run of speculative-decoding verify steps as the vLLM bulk owner proved it (scheduler/bulk/spec.py):
the record its planner prices, times, cuts and applies (simulator/fastpath/spec_runs.py), and the
scan of one request's steps that proof reads (first_event)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.bulk.spec_join import SpecJoin
    from servesim.scheduler.request import Request


# What ends a request's part of a run first (first_event), in the order the loop meets them at a step
NONE, SKIP, CUT, STOP, TOO_LONG = 0, 1, 2, 3, 4


def first_event(c0: int, gains: list[int], bump0: int, k: int, lim: int, to_max_tokens: int, to_max_len: int,
                 async_: bool) -> tuple[int, int, list[int]]:
    """(j, what, contexts) for one request of a run of k steps: the first step j where something
    happens, in the order the loop meets them at a step (passed over at schedule j: async, its
    in-flight steps reach max_tokens; schedule j cut by max_model_len: its context above lim;
    update j stopping it: its outputs reach to_max_tokens more; update j reaching max_model_len:
    to_max_len more tokens), or (k, NONE); and the contexts of the schedules that take it
    (through step j for a stop or too_long, before it otherwise). The outputs and contexts both
    grow strictly (every update appends one token or more; a schedule adds 1 + ns tokens and a
    clawback takes back at most ns), so a scan stops at the first. A verify of ns drafts
    accepting a adds 1 + ns to the context and claws back ns - a: the context grows by the update's
    gain, and by bump0 more at update 0 (SpecRunPlan.bumps)."""
    cs: list[int] = []
    outputs = 0  # outputs the updates before step j brought
    c = c0  # schedule j's context
    # One compare a check: sync never reaches skip_at at a schedule (the update before stopped it)
    skip_at = to_max_tokens - 1 if async_ else to_max_tokens
    stop_at = to_max_tokens if to_max_tokens < to_max_len else to_max_len
    for j in range(k):
        if outputs >= skip_at:
            return j, SKIP, cs
        if c > lim:
            return j, CUT, cs
        cs.append(c)
        g = gains[j]
        outputs += g
        if outputs >= stop_at:
            return j, (STOP if outputs >= to_max_tokens else TOO_LONG), cs
        c += g
        if j == 0:
            c += bump0
    return k, NONE, cs


@dataclass(slots=True)
class SpecRunPlan:
    """A run of verify steps of one fixed batch, as `VllmSpecRuns.plan` proved it.

    gains[i][j]: the tokens update j appends to batch[i] (update j applies step j sync, step j - 1
    async: update 0 applies the step in flight when the run starts). A verify of n drafts accepting
    a appends 1 + a and claws back n - a of the 1 + num_spec_tokens tokens its schedule added: the
    context grows by the gain plus num_spec_tokens - n. That is bumps[i] at update 0 (async: the
    step in flight verified n drafts, none where it ran the prompt's last chunk; 0 sync) and 0
    at every later one (the run's steps verify num_spec_tokens drafts).
    ctx[i][j]: batch[i]'s num_computed_tokens when step j is scheduled (the step's context, what
    its price reads).
    join: the waiting prompt schedule 0 admits, batch's last (bulk/spec_join.py): ctx[-1][0] is
    its prefix hit, the context its prefill computes on (priced as a mixed step, not a verify),
    gains[-1][0] is 0 and bumps[-1] applies at update 1."""

    batch: list[Request]
    num_steps: int
    gains: list[list[int]]
    bumps: list[int]
    ctx: list[list[int]]
    steps_each: list[int]  # schedules of the run that take batch[i] (its first steps_each[i])
    finish_at: list[int | None]  # the update that stops batch[i] inside the run (async), or None
    join: SpecJoin | None = None

    def cut(self, num_steps: int) -> None:
        """Keep the first num_steps steps (a prefix of a plan is a plan: an arrival cut it)."""
        self.num_steps = num_steps
        self.steps_each = [min(m, num_steps) for m in self.steps_each]
        self.finish_at = [None if f is None or f >= num_steps else f for f in self.finish_at]

    def step_sums(self, first: int) -> tuple[list[int], list[int]]:
        """(requests, context sum) of each step first .. num_steps - 1: what a verify step's price
        reads (every request computes 1 + num_spec_tokens tokens)."""
        k = self.num_steps
        # Step j's batch is the requests scheduled more than j times: with them ordered by that
        # count, a prefix. Each sum is a local int (a list item's `+=` is a generic call compiled).
        order = sorted(range(len(self.ctx)), key=self.steps_each.__getitem__, reverse=True)
        ctxs = [self.ctx[i] for i in order]
        counts = [min(self.steps_each[i], k) for i in order]
        n = len(order)
        sizes: list[int] = []
        sums: list[int] = []
        for j in range(first, k):
            while n and counts[n - 1] <= j:
                n -= 1
            total = 0
            for x in range(n):
                total += ctxs[x][j]
            sizes.append(n)
            sums.append(total)
        return sizes, sums

    def batch_at(self, j: int) -> list[int]:
        """The indices into `batch` of the requests step j schedules."""
        return [i for i, m in enumerate(self.steps_each) if m > j]
