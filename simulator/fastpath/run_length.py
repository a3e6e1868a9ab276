"""When the planner tries to plan: a backoff on failed proofs, decided by measured run lengths.

A run is only ever planned from a loop-top state whose next steps are plain decodes; on a
prefill-bound trace (Mooncake: 99 % of steps carry a prefill chunk, or a waiting request's
prefix-cache lookup must be proven refused) nearly every attempt fails, and each failed proof
costs a walk of the batch and the waiting head's prefix-cache lookup: the Mooncake conversation
trace (first 3,000 requests, Llama-3.1-70B TP8) made 19,172 attempts for 1 run, 6.6 % of the
simulation's time. On the Azure conversation hour (first 5,000 requests) a success followed at
most 11 failed attempts (1-4 for 96 % of its 3,855 runs).

`PlanGate` counts consecutive failed attempts (an attempt that applied nothing and left no run
pending; an async tail step alone, one step applied, neither fails nor ends the backoff). After `FREE_FAILURES` of them it skips the next loop tops, 1, 2, 4, ...
of them, doubling after each further failure, capped by the runs measured so far: the mean
length of the runs this planner applied (at least `MIN_SKIP_CAP`, at most `MAX_SKIP`; `MAX_SKIP`
before any run). Skipping s loop tops misses at most the first s steps of a run that became
possible meanwhile (the next attempt plans the rest of it), so the cap keeps that loss within
about one run of the kind this trace produces. Any attempt that applies a run (two or more
steps, or a deferred one) ends the backoff.

Exactness does not depend on the gate: a skipped loop top is stepped, and stepping is the
reference (the planner's runs leave the state stepping reaches). The gate counts loop tops,
never wall time, so the same run attempts the same plans on every machine.
"""

from __future__ import annotations

from typing import Final

# Consecutive failed attempts before the gate starts skipping. Above the longest failure streak
# before a success measured on the Azure conversation hour (11, first 5,000 requests; module
# docstring), so the plain-decode traces the fast path was built for keep every attempt.
FREE_FAILURES: Final = 16
# The skip's cap: never more loop tops than this between two attempts (before any run, the cap).
MAX_SKIP: Final = 64
# The cap's floor when the measured runs are short: short runs still pay for an attempt every
# few steps (a run of k steps saves k - 1 schedules, a failed attempt costs less than one).
MIN_SKIP_CAP: Final = 4


class PlanGate:
    """Whether the planner attempts a run at this loop top (module docstring)."""

    __slots__ = ("num_failures", "skip_left", "num_attempts", "num_skipped", "num_runs", "num_run_steps")

    def __init__(self) -> None:
        self.num_failures = 0  # consecutive failed attempts since the last run
        self.skip_left = 0  # loop tops still to step without an attempt
        self.num_attempts = 0  # attempts made (counters: tests and benchmarks read them)
        self.num_skipped = 0  # loop tops stepped without an attempt
        self.num_runs = 0  # runs applied (two or more steps, or deferred)
        self.num_run_steps = 0  # steps those runs applied when planned eagerly (deferred: 0)

    def should_try(self) -> bool:
        """At a loop top: attempt a run (True), or step without one (False)."""
        if self.skip_left:
            self.skip_left -= 1
            self.num_skipped += 1
            return False
        self.num_attempts += 1
        return True

    def record(self, num_steps_applied: int, run_pending: bool) -> None:
        """The attempt's outcome: the steps it applied now, and whether it left a run to apply
        later (a cluster replica's deferred run)."""
        if num_steps_applied >= 2 or run_pending:
            self.num_runs += 1
            self.num_run_steps += num_steps_applied
            self.num_failures = 0
            return
        if num_steps_applied:
            return  # a tail step alone: no run, but no failed proof either (it saved a schedule)
        self.num_failures += 1
        if self.num_failures >= FREE_FAILURES:
            self.skip_left = min(1 << min(self.num_failures - FREE_FAILURES, 30), self.skip_cap())

    def skip_cap(self) -> int:
        """The most loop tops skipped between two attempts: the mean measured run length, within
        [MIN_SKIP_CAP, MAX_SKIP]; MAX_SKIP before any run was measured."""
        if not self.num_run_steps:
            return MAX_SKIP
        return max(MIN_SKIP_CAP, min(MAX_SKIP, self.num_run_steps // self.num_runs))
