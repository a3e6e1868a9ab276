"""fcfs (vLLM's default): first come, first served; preempt the most recently admitted request.

Preempted requests are prepended to the waiting queue, so they resume before newer arrivals.
Other policies subclass FCFSPolicy and override only what they change.
"""

from __future__ import annotations

from servesim.scheduler.policies.base import SCHEDULING_POLICIES
from servesim.scheduler.queues import FCFSRequestQueue, RequestQueue
from servesim.scheduler.request import Request

__all__ = ["FCFSPolicy", "FCFSRequestQueue"]  # the queue lives in queues.py: compiled with the scheduler


@SCHEDULING_POLICIES.register("fcfs")
class FCFSPolicy:
    """Holds no state: every hook but the queue order is a no-op."""

    fast_forward_safe = True
    queue_type: type[RequestQueue] = FCFSRequestQueue

    def __init__(self, config=None, kv_cache_manager=None, requests=None) -> None:
        pass

    def make_waiting_queue(self) -> RequestQueue:
        return self.queue_type()

    def make_skipped_queue(self) -> RequestQueue:
        return self.queue_type()

    def select_queue(self, waiting: RequestQueue, skipped: RequestQueue) -> RequestQueue:
        # Skipped requests (their KV load has landed, a LoRA slot freed) were ahead of everything
        # still waiting, so they go first.
        return skipped or waiting

    def pick_victim(self, running: list[Request]) -> Request:
        return running[-1]

    def on_step(self, now_s: float) -> None:
        pass

    def on_arrival(self, request: Request, now_s: float) -> None:
        pass

    def on_finish(self, request: Request, now_s: float) -> bool:
        return False

    def next_event_s(self) -> float | None:
        return None

    def held_request_ids(self) -> set[str]:
        return set()

    def num_held_requests(self) -> int:
        return 0

    def trace_fields(self) -> dict:
        return {"num_pinned": 0, "pinned_blocks": 0, "pinned_job_ids": []}
