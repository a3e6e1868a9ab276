"""priority (vLLM's `--scheduling-policy priority`): lower `Request.priority` first, then earlier
arrival, then request id; the victim is the running request with the highest (priority, arrival).

A heap has no front, so a preempted request is simply re-added: its (priority, arrival) key puts
it where it belongs. The victim may have been scheduled earlier in the same step; schedule() rolls
that back.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from servesim.scheduler.policies.base import SCHEDULING_POLICIES
from servesim.scheduler.policies.fcfs import FCFSPolicy
from servesim.scheduler.queues import RequestQueue
from servesim.scheduler.request import Request


class PriorityRequestQueue(RequestQueue):
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)  # Request.__lt__: (priority, arrival_time, request_id)

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


def _victim_key(r: Request) -> tuple[int, float]:
    return r.priority, r.arrival_time


@SCHEDULING_POLICIES.register("priority")
class PriorityPolicy(FCFSPolicy):
    queue_type = PriorityRequestQueue

    def select_queue(self, waiting: RequestQueue, skipped: RequestQueue) -> RequestQueue:
        # Both queues are ordered by the same key: read whichever head ranks first.
        if waiting and skipped:
            return waiting if waiting.peek_request() < skipped.peek_request() else skipped
        return waiting or skipped

    def pick_victim(self, running: list[Request]) -> Request:
        return max(running, key=_victim_key)
