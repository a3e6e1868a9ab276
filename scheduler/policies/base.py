"""The scheduling-policy contract, and the registry that `scheduler.policy` names are looked up in.

A policy decides *order*, never *amount*: which waiting request is considered next, which running
request is preempted when KV runs out, and what happens to a request's KV when it finishes (free
it, or keep it for a while). The token budget, KV allocation and output building stay in
`schedule()` (scheduler/_schedule.py), which calls the policy only through this Protocol and never
names a policy.

Adding a policy is one new file in this package: a class satisfying `SchedulingPolicy`, decorated
with `@SCHEDULING_POLICIES.register("name")`. Every module in `scheduler/policies/` is imported
on the first lookup, so the file needs no entry anywhere else (docs/ARCHITECTURE.md has an example).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from servesim.scheduler.registry import Registry

if TYPE_CHECKING:
    from servesim.scheduler.config import SchedulerConfig
    from servesim.scheduler.kv.manager import KVCacheManager
    from servesim.scheduler.queues import RequestQueue
    from servesim.scheduler.request import Request


DEFAULT_POLICY = "fcfs"  # vLLM's default scheduling policy


class SchedulingPolicy(Protocol):
    """What the vLLM scheduler asks of its policy. One instance per Scheduler; it may keep state.

    Hot-path note: the scheduler binds `select_queue` and `make_skipped_queue` once at
    construction, so they must not be replaced on the instance afterwards.
    """

    # True when `on_step` is a no-op as long as no request finishes and nothing waits, so an
    # engine may apply provably plain decode steps without calling schedule() (fast-forward).
    fast_forward_safe: bool

    def make_waiting_queue(self) -> RequestQueue:
        """The scheduler's WAITING queue (called once). The policy may keep a reference to it to
        steer its order from `on_step`."""

    def make_skipped_queue(self) -> RequestQueue:
        """A queue for requests skipped this step (blocked on a KV load, LoRA slots full). Called
        once for `skipped_waiting` and once per schedule() for the step's skipped requests."""

    def select_queue(self, waiting: RequestQueue, skipped: RequestQueue) -> RequestQueue:
        """Which of the two non-empty-or-not queues to read the next request from; at least one
        of them is non-empty."""

    def pick_victim(self, running: list[Request]) -> Request:
        """The RUNNING request to preempt when a KV allocation fails (`running` is non-empty)."""

    def on_step(self, now_s: float) -> None:
        """Start of every schedule(), before any allocation: timed state changes happen here."""

    def on_arrival(self, request: Request, now_s: float) -> None:
        """A request entered the scheduler (after it was queued)."""

    def on_finish(self, request: Request, now_s: float) -> bool:
        """A request finished and its blocks are about to be freed. True: the policy keeps them
        (it frees them itself later, through the KV cache manager); False: free them now."""

    def next_event_s(self) -> float | None:
        """The earliest simulated time at which the policy's state changes by itself (e.g. held
        KV being released), or None. An idle engine sleeps until then at the latest."""

    def held_request_ids(self) -> set[str]:
        """Finished requests whose KV blocks the policy still holds (for invariant checks)."""

    def num_held_requests(self) -> int:
        """len(held_request_ids()), cheaply (reported in SchedulerStats every step)."""

    def trace_fields(self) -> dict:
        """The policy's part of a step-trace snapshot (same keys for every policy)."""


# factory(scheduler_config, kv_cache_manager, requests) -> policy. `requests` is the scheduler's
# req_id -> Request map: a policy that keeps finished requests' KV removes them from it on release.
PolicyFactory = Callable[["SchedulerConfig", "KVCacheManager", dict], SchedulingPolicy]


SCHEDULING_POLICIES: Registry[PolicyFactory] = Registry("policy", plugins="servesim.scheduler.policies")


def make_policy(config: SchedulerConfig, kv_cache_manager: KVCacheManager, requests: dict) -> SchedulingPolicy:
    """The policy named by `config.policy` (unknown name: a did-you-mean error)."""
    return SCHEDULING_POLICIES.get(config.policy)(config, kv_cache_manager, requests)
