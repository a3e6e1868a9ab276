"""A run of speculative-decoding verify steps as the vLLM bulk owner proved it (scheduler/bulk/spec.py):
the record its planner prices, times, cuts and applies (simulator/fastpath/spec_runs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


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
    its price reads)."""

    batch: list[Request]
    num_steps: int
    gains: list[list[int]]
    bumps: list[int]
    ctx: list[list[int]]
    steps_each: list[int]  # schedules of the run that take batch[i] (its first steps_each[i])
    finish_at: list[int | None]  # the update that stops batch[i] inside the run (async), or None

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
