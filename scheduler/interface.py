"""The scheduler contract: what every scheduler implements and every caller may use.

Implementations: the vLLM V1 `Scheduler` / `AsyncScheduler` (scheduler/scheduler.py), the
`SGLangScheduler` (scheduler/sglang/scheduler.py) and the P/D prefill and decode schedulers built
on the vLLM ones (simulator/cluster/pd_schedulers.py). Callers: the engine loop (simulator/engine.py), the
executors (they read only the SchedulerOutput), fast-forward, the routers, the metrics, the step
traces (scheduler/oracle_trace.py) and the liveness diagnosis (simulator/liveness.py).

A caller never probes a scheduler for optional attributes: what differs between schedulers is
declared once in `SchedulerCapabilities` (read it once and keep it: it never changes after
construction) or answered by a method every scheduler has (`overlap_allowed`, `next_event_s`,
`cached_prefix_tokens`, `cpu_cached_prefix_tokens`). Anything else a caller needs becomes a member here first.
The bulk decode path of exact macro-steps is a separate contract, served by an owner object
beside the scheduler (scheduler/bulk/interface.py: `DecodeRuns`), which a scheduler names in
`SchedulerCapabilities.decode_runs`.

Modelled on vLLM's `vllm/v1/core/sched/interface.py` (SchedulerInterface); the members beyond it
are what a simulator needs and an engine process does not: a clock passed in (`now_s`), the
engine's batch-queue depth, and side-effect-free queries for routers and traces.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from servesim.scheduler.hashing import TokenProvenance
    from servesim.scheduler.output import EngineCoreOutputs, ModelRunnerOutput, RequestOutput, SchedulerOutput, SchedulerStats
    from servesim.scheduler.request import Request, RequestStatus

PREFIX_CACHE_KINDS = ("block_hash", "radix")


@dataclass(slots=True, frozen=True)
class SchedulerCapabilities:
    """What a scheduler declares about itself, fixed at construction."""

    # Steps the engine may keep in flight: 1 = schedule, execute, update, repeat; 2 = vLLM's async
    # scheduling / SGLang's overlap schedule (step N+1 is scheduled before step N's output is
    # applied). `overlap_allowed` may still serialise a particular pair of steps. Pipeline
    # parallelism deepens the engine's batch queue beyond this (config.max_concurrent_batches).
    max_steps_in_flight: int
    # True: a schedule() that scheduled and preempted nothing, with no step in flight, decides the
    # same nothing again until something outside changes (an arrival, a KV transfer, an abort) or
    # `next_event_s` comes due, so the engine may sleep instead of stepping again at once.
    idle_is_stable: bool
    # How the prefix cache is keyed: "block_hash" (vLLM: chained hashes of full blocks), "radix"
    # (SGLang: a radix tree over token ids), or None when prefix caching is off.
    prefix_cache: str | None
    # The scheduler's bulk decode path, by its name in scheduler.bulk's registry ("vllm",
    # "sglang"), or None: exact macro-steps never apply to it. Declared by the class that defines
    # what a step does; a subclass that changes it (P/D's) declares None, whatever it inherits.
    decode_runs: str | None = None

    def __post_init__(self) -> None:
        if self.max_steps_in_flight not in (1, 2):
            raise ValueError(f"max_steps_in_flight must be 1 or 2, got {self.max_steps_in_flight}")
        if self.prefix_cache is not None and self.prefix_cache not in PREFIX_CACHE_KINDS:
            raise ValueError(f"prefix_cache must be one of {PREFIX_CACHE_KINDS} or None, got {self.prefix_cache!r}")


@dataclass(slots=True, frozen=True)
class StrandedRequest:
    """A waiting request the scheduler can never admit as the engine stands (`stranded_request`)."""

    request_id: str
    reason: str  # one of STRANDED_REASONS: which admission rule it can never pass
    detail: str  # the numbers: what it needs and what the scheduler has


# kv_pool: its KV blocks (the full-ISL check, or its first chunk) exceed the whole free pool;
# token_budget: chunked prefill is off and its tokens exceed the per-step token budget.
STRANDED_REASONS = ("kv_pool", "token_budget")


@runtime_checkable
class KVCacheUsage(Protocol):
    """The part of a scheduler's KV cache manager callers read (the engine, once per step)."""

    @property
    def usage(self) -> float:
        """Fraction of the KV pool in use; cached blocks no request holds count as free."""
        ...


@runtime_checkable
class SchedulerInterface(Protocol):
    """One scheduler instance: requests in, one SchedulerOutput per step, outputs back.

    Time is only ever passed in (`now_s`, simulated seconds); a scheduler never reads a clock.
    """

    capabilities: SchedulerCapabilities
    requests: dict[str, Request]  # every unfinished request (and finished ones still holding KV)
    kv_cache_manager: KVCacheUsage

    # --- requests in ------------------------------------------------------------------------------
    def add_request(self, request: Request, now_s: float | None = None) -> None:
        """Add a new request to the scheduler's waiting queue. A request that can never run (its
        prompt can never fit) is finished as ignored at once and reported by
        `take_ignored_outputs`."""
        ...

    def mark_grammar_ready(self, request_id: str) -> None:
        """A structured-output request's grammar has compiled: it may be scheduled from now on
        (vLLM's WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR wait). A scheduler without grammar waits
        refuses structured-output requests instead."""
        ...

    def take_ignored_outputs(self) -> list[RequestOutput]:
        """Outputs of requests the scheduler refused at `add_request` (returned once), each with
        the rule it failed in `reject_reason` (simulator/liveness.py REJECT_REASONS)."""
        ...

    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus,
                        now_s: float | None = None) -> list[str]:
        """Finish requests from outside the scheduler (e.g. a client went away): they leave the
        queues and free their KV as the engine would. Returns the ids that were unfinished."""
        ...

    # --- one step ---------------------------------------------------------------------------------
    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        """Decide the next step: which requests run, how many tokens each, which are preempted."""
        ...

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput,
                           now_s: float | None = None) -> EngineCoreOutputs:
        """Apply one executed step's output (sampled tokens, KV transfers): append tokens, finish
        requests that stopped, free their KV. Returns what the engine reports to clients."""
        ...

    def overlap_allowed(self, prev_scheduler_output: SchedulerOutput, scheduler_output: SchedulerOutput) -> bool:
        """With two steps in flight: may `scheduler_output`'s CPU work overlap
        `prev_scheduler_output` on the GPU? False makes the engine serialise that pair (SGLang's
        consecutive-prefill exception). Only asked when max_steps_in_flight is 2."""
        ...

    def next_event_s(self) -> float | None:
        """The earliest simulated time at which this scheduler's state changes by itself (e.g. a
        Continuum pin expiring); None when nothing is pending. The engine's idle wait wakes then."""
        ...

    def stranded_request(self) -> StrandedRequest | None:
        """The head waiting request (the one the policy would admit next) if it can never be
        admitted as the engine stands, and why; None otherwise. "As the engine stands": nothing
        runs, no request holds KV (the whole pool is free), the whole token budget is free and the
        prefix cache holds what it holds now (only another request running changes it), so the
        very admission checks schedule() runs fail for it now and at every later step. Blocked
        waits (grammar, remote KV, streaming input) are never stranded. Changes no state (no LRU
        touch, no stats). vLLM 0.19.1 waits on such a request forever (its scheduler refuses a
        request only at add_request); the engine aborts it unless liveness.stranded_requests is
        "wait" (docs/LIVENESS.md). A scheduler that refuses or aborts such requests itself
        (SGLang) always answers None."""
        ...

    # --- state queries ----------------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        """True while the engine loop has work for this scheduler."""
        ...

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or running (a router's load signal)."""
        ...

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) as this scheduler's stats count them."""
        ...

    def get_queue_lengths(self) -> tuple[int, int]:
        """(requests in the running queue, requests in the waiting queues incl. blocked ones): the
        vLLM step trace's num_running / num_waiting and vLLM's DP balancer's inputs."""
        ...

    def get_num_free_blocks(self) -> int:
        """Free KV blocks (pages), cached blocks no request holds included (vLLM's count)."""
        ...

    def cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None = None,
                             provenance: TokenProvenance | None = None) -> int:
        """How many leading tokens of a prompt `token_ids` (for LoRA `lora_id`) this scheduler would
        serve from its prefix cache if the request arrived now -- as the scheduler itself counts a
        hit (whole blocks or pages, the last prompt token always recomputed). Changes no state: no
        LRU touch, no stats, no split. 0 when prefix caching is off. `provenance` is what the
        request itself would carry (Request's token_provenance): a cache keyed by it must be asked
        with it; a cache keyed by the ids themselves (SGLang's radix tree) ignores it."""
        ...

    def cpu_cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None = None,
                                 provenance: TokenProvenance | None = None, num_gpu_cached_tokens: int = 0) -> int:
        """How many prompt tokens past the first `num_gpu_cached_tokens` (what
        `cached_prefix_tokens` answered for the same prompt) this scheduler's CPU KV tier would
        load if the request arrived now, as the scheduler itself counts such a hit: vLLM's
        OffloadingConnector (the CPU manager's lookup, whole offload blocks from the GPU hit to
        the first miss; the connector's `peek_num_matched_tokens`), SGLang's HiCache (host-only
        nodes of the radix tree below the device match, when load_back would load them). Changes
        no state. 0 without a CPU tier (or without prefix caching)."""
        ...

    def make_stats(self) -> SchedulerStats:
        """Stats since the last call (prefix-cache counters are reset)."""
        ...
