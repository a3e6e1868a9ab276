"""Blocked waits of vLLM 0.19.1's scheduler besides the remote-KV one: a request waiting for its
structured-output grammar (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR) and a streaming-input session
waiting for its next input chunk (WAITING_FOR_STREAMING_REQ).

Both sit in `skipped_waiting` (scheduler/_schedule.py walks it interleaved with `waiting`, as
vLLM's `_select_waiting_queue_for_scheduling`) and are promoted when schedule() reaches them and
their blocker has resolved (`try_promote`, vLLM's `_try_promote_blocked_waiting_request`).

- Grammar: vLLM compiles a request's grammar in a thread pool (StructuredOutputManager.grammar_init)
  and the scheduler polls the future when it looks at the request. Here something outside (the
  simulator's compile timer, a replay's step rule) calls `Scheduler.mark_grammar_ready`.
- Streaming input (vLLM's resumable requests): the first chunk arrives as a request with
  `resumable=True`; later chunks arrive as add_request calls with the same id (`add_session_input`).
  When a chunk's generation stops the session is not finished: it takes the next queued chunk, or
  parks in WAITING_FOR_STREAMING_REQ (`handle_stopped_request`). The input stream's close arrives
  as an update of None: a parked session then finishes as aborted (vLLM's add_request), a busy one
  finishes when its current chunk stops. Parked sessions do not count as unfinished work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.request import Request, RequestStatus, SamplingParams

if TYPE_CHECKING:
    from servesim.scheduler.scheduler import Scheduler


@dataclass(slots=True)
class StreamingUpdate:
    """One input chunk of a streaming session (vLLM's StreamingUpdate, scheduler-visible fields)."""

    prompt_token_ids: Sequence[int]
    arrival_time: float
    sampling_params: SamplingParams

    @staticmethod
    def from_request(request: Request) -> StreamingUpdate | None:
        """None for a non-resumable request: the input stream's close signal (as vLLM)."""
        if not request.resumable:
            return None
        return StreamingUpdate(list(request.prompt_token_ids), request.arrival_time, request.sampling_params)


def try_promote(self: Scheduler, request: Request) -> bool:
    """A grammar- or streaming-blocked request that schedule() reached: WAITING if it may run now."""
    if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
        so = request.structured_output_request
        if so is None or not so.grammar_ready:
            return False
        request.status = RequestStatus.WAITING
        return True
    if request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
        # A chunk for a parked session is applied when it arrives (add_session_input): a parked
        # session never has one queued.
        assert not request.streaming_queue
        return False
    raise AssertionError(f"unexpected blocked status {request.status.name} for {request.request_id}")


def mark_grammar_ready(self: Scheduler, request_id: str) -> None:
    """The grammar of request_id finished compiling (unknown or finished ids are ignored)."""
    request = self.requests.get(request_id)
    if request is None or request.is_finished() or request.structured_output_request is None:
        return
    request.structured_output_request.grammar_ready = True


def add_session_input(self: Scheduler, existing: Request, request: Request) -> None:
    """add_request with the id of a live session: the next chunk (or the close) of its input."""
    update = StreamingUpdate.from_request(request)
    if existing.status != RequestStatus.WAITING_FOR_STREAMING_REQ:
        if existing.streaming_queue is None:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        existing.streaming_queue.append(update)  # applied when the running chunk stops
    elif update is not None:
        update_request_as_session(self, existing, update)
    else:  # the stream closed while the session waited for input
        self.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)


def update_request_as_session(self: Scheduler, session: Request, update: StreamingUpdate) -> None:
    """Continue the session with the next chunk (vLLM's _update_request_as_session); the caller
    enqueues it where it is not queued yet."""
    session.continue_session(update.prompt_token_ids)
    session.arrival_time = update.arrival_time
    session.sampling_params = update.sampling_params
    if session.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
        self.num_waiting_for_streaming_input -= 1
    session.status = RequestStatus.WAITING


def handle_stopped_request(self: Scheduler, request: Request) -> bool:
    """A request stopped: True if it is finished; a session takes its next chunk or parks."""
    if not request.resumable:
        return True
    queue = request.streaming_queue
    if queue:
        update = queue.popleft()
        if update is None:
            return True  # the stream closed: this chunk was the last
        update_request_as_session(self, request, update)
    else:
        request.status = RequestStatus.WAITING_FOR_STREAMING_REQ
        self.num_waiting_for_streaming_input += 1
    self._enqueue_waiting_request(request)
    return False


def on_new_request(request: Request) -> None:
    """add_request of a new id: a session gets its (empty) queue of chunks."""
    if request.resumable:
        request.streaming_queue = deque()
