"""The waiting-queue interface. Each scheduling policy (scheduler/policies/) brings its own queue;
schedule() only uses the methods below."""

from __future__ import annotations

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
