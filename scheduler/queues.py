"""Waiting queues, registered by policy name.

- fcfs: a deque; preempted requests are prepended so they resume first.
- priority: a heap ordered by (priority, arrival_time, request_id); prepend degrades to add.
- continuum: FCFS, except that turns of jobs whose previous turn is pinned go first (their
  prefix is warm, and the pin is wasted if they wait).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from scheduler.registry import Registry
from scheduler.request import Request


class RequestQueue:
    """Interface shared by every waiting queue."""

    def add_request(self, request: Request) -> None: raise NotImplementedError
    def pop_request(self) -> Request: raise NotImplementedError
    def peek_request(self) -> Request: raise NotImplementedError
    def prepend_request(self, request: Request) -> None: raise NotImplementedError
    def prepend_requests(self, requests: RequestQueue) -> None: raise NotImplementedError
    def remove_request(self, request: Request) -> None: raise NotImplementedError
    def remove_requests(self, requests: Iterable[Request]) -> None: raise NotImplementedError
    def __len__(self) -> int: raise NotImplementedError
    def __iter__(self) -> Iterator[Request]: raise NotImplementedError

    def __bool__(self) -> bool:
        return len(self) > 0

    def update_pinned_state(self, pinned_job_ids: set[str]) -> None:
        """Hint from the Continuum policy; plain queues ignore it."""


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


class PriorityRequestQueue(RequestQueue):
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)  # a heap has no front to prepend to

    def prepend_requests(self, requests: RequestQueue) -> None:
        for r in requests:
            self.add_request(r)

    def remove_request(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(requests)
        self._heap = [r for r in self._heap if r not in drop]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        heap = self._heap[:]
        while heap:
            yield heapq.heappop(heap)


class ContinuumRequestQueue(FCFSRequestQueue):
    """FCFS, but the oldest request of a pinned job is served before the head."""

    __slots__ = ("_pinned",)

    def __init__(self) -> None:
        super().__init__()
        self._pinned: set[str] = set()

    def update_pinned_state(self, pinned_job_ids: set[str]) -> None:
        self._pinned = pinned_job_ids

    def _first_warm(self) -> Request | None:
        if self._pinned:
            for r in self._dq:
                if r.job_id is not None and r.job_id in self._pinned:
                    return r
        return None

    def peek_request(self) -> Request:
        warm = self._first_warm()
        return warm if warm is not None else super().peek_request()

    def pop_request(self) -> Request:
        warm = self._first_warm()
        if warm is None:
            return self._dq.popleft()
        self._dq.remove(warm)
        return warm


QUEUE_POLICIES: Registry[type[RequestQueue]] = Registry("scheduling policy")
QUEUE_POLICIES.add("fcfs", FCFSRequestQueue)
QUEUE_POLICIES.add("priority", PriorityRequestQueue)
QUEUE_POLICIES.add("continuum", ContinuumRequestQueue)


def create_request_queue(policy: str) -> RequestQueue:
    return QUEUE_POLICIES.get(policy)()
