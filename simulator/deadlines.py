"""Client deadlines still pending: when each request's client gives up (client.timeout_s).

A heap of (deadline s, submission sequence number, request id): equal deadlines come due in
submission order. An entry whose request already finished is simply dropped when it comes due
(the scheduler reports the request as no longer unfinished).
"""

from __future__ import annotations

import heapq
import math


class ClientDeadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._num_pushed = 0  # the tie-breaker: submission order

    def push(self, deadline_s: float, request_id: str) -> None:
        heapq.heappush(self._heap, (deadline_s, self._num_pushed, request_id))
        self._num_pushed += 1

    def __bool__(self) -> bool:
        return bool(self._heap)

    @property
    def next_s(self) -> float:
        """The earliest pending deadline (inf: none)."""
        return self._heap[0][0] if self._heap else math.inf

    def is_due(self, now: float) -> bool:
        return bool(self._heap) and self._heap[0][0] <= now

    def pop_due(self, now: float) -> str | None:
        """The request id of the earliest deadline at or before now, removed; None when none is due."""
        if self._heap and self._heap[0][0] <= now:
            return heapq.heappop(self._heap)[2]
        return None
