"""The bulk decode contract: what the engine's fast path (exact macro-steps) asks of a scheduler's
bulk decode path, an owner object beside the scheduler (scheduler/bulk/__init__.py says whose
state it may read and why).

A plain decode step schedules one token for every request of a fixed batch and admits, preempts
and (but through finishes) finishes nobody. A run of them applied by a `DecodeRuns` owner leaves
exactly the state their schedule() and update_from_output() calls leave one by one: block or page
ids, cache state, counters, queues and the SchedulerOutput left in flight. The engine needs
nothing else from the scheduler beyond `SchedulerInterface`.

Joins: an async run's first schedule may also admit waiting requests, by the scheduler's own
waiting phase behind the batch's decodes, each computing the rest of its prompt there (vLLM's new
request whose whole prompt fits the step: scheduler/bulk/vllm.py; P/D's landed transfer, one
token in blocks it holds: scheduler/bulk/pd.py); from the second schedule on they decode with
the batch. `decode_run_joining` names them and what each computes, the run's batch ends with
them, and the first schedule reports them (DecodeRunEffects.joined) for what the engine records
of a request's first scheduling and the step's price (a mixed step where a prompt joins).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from servesim.scheduler.lazy_ids import RunTokens
    from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput, SchedulerStats
    from servesim.scheduler.request import Request


@dataclass(slots=True)
class DecodeRunEffects:
    """What schedule_decode_steps did, for the engine's step rows."""

    free_after: list[int]  # free blocks (pages) after each schedule (the step's kv usage)
    finished: set[str]  # finished since the previous schedule: the first step hands them to the worker
    prefix_hits: list[int]  # per update (empty without updates): the prefix-cache stats it took
    prefix_queries: list[int]
    joined: list[Request] = field(default_factory=list)  # admitted by a run's first schedule (joins)
    joined_tokens: list[int] = field(default_factory=list)  # the tokens each of them computed there


@dataclass(slots=True)
class Joins:
    """The requests a run's first schedule admits behind its batch (module docstring, "Joins"),
    in admission order: request i computes num_new_tokens[i] tokens there on contexts[i] computed
    ones, its whole prompt (num_tokens = contexts[i] + num_new_tokens[i]), and samples; it then
    decodes one token a schedule, as a running request with one step in flight does."""

    requests: list[Request]
    contexts: list[int]  # its computed tokens (prefix hit, chunk, or P/D's loaded prompt less one) at that schedule
    num_new_tokens: list[int]  # the tokens it computes there (>= 1)
    num_running: int = 0  # the first ones are running already (a prefill chunk completing), the rest admitted

    def decode_contexts(self) -> list[int]:
        """Each one's context as a run of decodes would have it at the first schedule (its whole
        prompt less one: one token a step after it), for the later steps' prices and blocks."""
        return [c + n - 1 for c, n in zip(self.contexts, self.num_new_tokens)]

    def prompt_tokens(self) -> bool:
        """Whether one computes more than one token: the first step is then a mixed step, priced
        as such (a one-token join is priced as a decode on the same context)."""
        return any(n > 1 for n in self.num_new_tokens)


@dataclass(slots=True)
class SampledStepUpdate:
    """What update_sampled_step applied: the requests that got their one token, in the step's
    order, and the update's statistics (update_from_output's EngineCoreOutputs.scheduler_stats)."""

    req_ids: list[str]
    stats: SchedulerStats


class DecodeRuns(Protocol):
    """A scheduler's bulk decode path: proves how many of the next steps are plain decode steps and
    applies them at once. vLLM's (scheduler/bulk/vllm.py) and SGLang's (scheduler/bulk/sglang.py);
    a scheduler names its own in `SchedulerCapabilities.decode_runs` and `decode_runs_for` builds
    it. Schedulers that change what a step does (P/D) declare none, whatever they inherit."""

    def decode_run_blocker(self) -> str | None:
        """Why no run can ever apply to this scheduler as configured (a policy that changes state
        every step, a tracer, a KV layout the bulk path does not replay); None: runs may apply,
        each proven by decode_run_horizon."""
        ...

    def decode_run_extra_steps(self) -> int:
        """Steps a request is still scheduled after the step that brings its last token, in a run
        through finishes: 0 for vLLM (the async skip-ahead passes it over), 1 for SGLang (the
        overlap schedule's extra forward, whose token is dropped)."""
        ...

    def arrivals_commute_with_decode_updates(self) -> bool:
        """Whether add_request between a plain decode step's schedule and its update (one that
        finishes nobody) leaves exactly the state the two leave in the other order: the engine
        may then apply a run's last update, due after an arrival, before that arrival is added
        (macro_step.py, "a run's last update past an arrival"). Statistics that update returns
        and nothing records (SchedulerStats' queue lengths) may differ."""
        ...

    def decode_run_horizon(self, max_steps: int, num_in_flight: int, through_finishes: bool = False) -> int:
        """How many of the next schedule() calls (at most max_steps) are provably plain decode steps
        of decode_run_requests(), with num_in_flight steps scheduled and not updated (0 or 1); 0
        when not even one. `through_finishes`: the batch may shrink as requests finish inside
        (a path that does not support it answers as if False and decode_run_steps then gives
        every request the whole run)."""
        ...

    def decode_run_requests(self) -> list[Request]:
        """The batch of the next plain decode step, in scheduling order."""
        ...

    def decode_run_joining(self) -> Joins:
        """The requests the next schedule admits behind decode_run_requests() (module docstring,
        "Joins") and what each computes there; empty for none. Read after decode_run_horizon
        counted them (only with one step in flight): a run then schedules decode_run_requests()
        + these, its first schedule admitting them."""
        ...

    def decode_run_steps(self, batch: Sequence[Request], num_steps: int) -> list[int]:
        """How many of a run's num_steps schedules take each request of `batch` (through finishes)."""
        ...

    def schedule_decode_steps(self, batch: Sequence[Request], num_steps: int, tokens: RunTokens | None,
                              now_s: float, steps_each: list[int] | None = None,
                              update_times_s: Sequence[float] = ()) -> DecodeRunEffects:
        """Apply num_steps plain decode schedules of `batch` and after each the update of one step
        (`tokens`: each request's sampled ids, as positions of their streams, appended unbuilt:
        scheduler/lazy_ids.py; None for schedules only); see scheduler/bulk/vllm.py. A batch that
        ends with decode_run_joining()'s requests is a run's first schedule (num_steps 1, no
        tokens): they are admitted behind the others' decodes (DecodeRunEffects.joined)."""
        ...

    def decode_step_output(self, batch: Sequence[Request], joined_tokens: Sequence[int] = ()) -> SchedulerOutput:
        """The SchedulerOutput of the run's last step, left in flight for update_from_output;
        `joined_tokens`: the batch's last requests joined at that schedule, computing these."""
        ...

    def update_sampled_step(self, so: SchedulerOutput, mro: ModelRunnerOutput,
                            now_s: float) -> SampledStepUpdate | None:
        """update_from_output(so, mro, now_s) of one step, stepped or left in flight by a run, where
        it is provably simple: no request of the step stops, none samples more than one token, no
        drafts, connector report or ignored request. Everything update_from_output changes is
        changed alike (tokens, counters, cached blocks, statistics); only the RequestOutputs it
        would return are not built (the returned ids say who got a token). None: declined,
        nothing done (the caller applies update_from_output)."""
        ...

    def finished_req_ids(self) -> set[str]:
        """The scheduler's requests finished since its previous schedule(): the next schedule (a
        run's first) hands them to the worker. The scheduler's own set, not a copy."""
        ...

    def usage_at(self, num_free_blocks: int) -> float:
        """The KV manager's `usage` as it reads when num_free_blocks blocks (pages) are free: the
        same float, for step rows of a run applied in bulk (DecodeRunEffects.free_after)."""
        ...

    def usages_at(self, num_free_blocks: list[int]) -> list[float]:
        """usage_at of each count, in order: a run's step rows in one call."""
        ...


# A registered bulk path: built from the scheduler that names it (SchedulerCapabilities.decode_runs).
DecodeRunsFactory = Callable[[Any], DecodeRuns]
