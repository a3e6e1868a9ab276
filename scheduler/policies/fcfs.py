"""fcfs (vLLM's default): first come, first served; preempt the most recently admitted request.

Preempted requests are prepended to the waiting queue, so they resume before newer arrivals.
Other policies subclass FCFSPolicy and override only what they change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from servesim.scheduler.policies.base import SCHEDULING_POLICIES
from servesim.scheduler.queues import RequestQueue
from servesim.scheduler.request import Request


class FCFSRequestQueue(RequestQueue):
    __slots__ = ("_dq",)

    def __init__(self) -> None:
        self._dq: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._dq.append(request)

    def pop_request(self) -> Request:
        return self._dq.popleft()

    def peek_request(self) -> Request:
        if not self._dq:
            raise IndexError("peek from an empty queue")
        return self._dq[0]

    def prepend_request(self, request: Request) -> None:
        self._dq.appendleft(request)

    def prepend_requests(self, requests: RequestQueue) -> None:
        # extendleft reverses: the last of `requests` ends up first (vLLM's behaviour).
        self._dq.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        self._dq.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(requests)
        self._dq = deque(r for r in self._dq if r not in drop)

    def __len__(self) -> int:
        return len(self._dq)

    def __bool__(self) -> bool:
        return bool(self._dq)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._dq)


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
