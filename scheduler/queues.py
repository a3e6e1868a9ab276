"""The waiting-queue interface. Each scheduling policy (scheduler/policies/) brings its own queue;
schedule() only uses the methods below.

The arrival-order queue is here rather than in policies/ (whose policies use it) so it is
compiled with the scheduler (policies/ stays interpreted: tools/compile_scheduler.py says why):
the scheduler asks the waiting queue its length or emptiness ~30 times per request, each call into
an interpreted class a Python call."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from servesim.scheduler.request import Request


class RequestQueue:
    """Interface shared by every waiting queue (a base class so `__bool__` comes for free)."""

    __slots__ = ()

    def add_request(self, request: Request) -> None:
        """A new (or re-queued) request, placed by the policy's order."""
        raise NotImplementedError

    def pop_request(self) -> Request:
        """Remove and return the request `peek_request` returns."""
        raise NotImplementedError

    def peek_request(self) -> Request:
        """The request schedule() should consider next (IndexError when empty)."""
        raise NotImplementedError

    def prepend_request(self, request: Request) -> None:
        """A preempted request: ahead of the queue where the order allows it."""
        raise NotImplementedError

    def prepend_requests(self, requests: RequestQueue) -> None:
        """Several skipped requests, as vLLM prepends them (the last of `requests` ends up first)."""
        raise NotImplementedError

    def remove_request(self, request: Request) -> None: raise NotImplementedError
    def remove_requests(self, requests: Iterable[Request]) -> None: raise NotImplementedError
    def __len__(self) -> int: raise NotImplementedError

    def __iter__(self) -> Iterator[Request]:
        """Every queued request, in the order they would be popped."""
        raise NotImplementedError

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """Arrival order; a preempted request goes back to the front."""

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
