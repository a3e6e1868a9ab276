"""Streaming-input sessions in a simulated run (vLLM's resumable requests, AsyncLLM.generate with an
input stream).

A request whose trace row has `input_chunk_offsets_s` / `input_chunk_lens` is a session: its first
prompt arrives as usual (resumable), and chunk j (its own synthetic ids) reaches the scheduler
offsets_s[j] seconds after the request, as an add_request with the same id
(scheduler/blocked_waits.py). The input stream closes with the last chunk: AsyncLLM's final
non-resumable request follows it at once, so the session finishes when the last chunk's generation
stops. Between chunks the session keeps its KV and waits in WAITING_FOR_STREAMING_REQ, which is
not unfinished work (the engine loop idles until the next chunk). Each chunk generates the
request's output_len tokens (vLLM keeps the first chunk's max_tokens for the whole session).

Each session's time parked (its previous chunk done, the next not there yet) adds up in its
record's `input_wait_s`.

A session's chunk ends carry a finish reason in the step outputs, as vLLM's do; only the session's
last one finishes the request (`is_chunk_end` tells them apart). A chunk for a session that has
already finished (its client gave up) is dropped, as AsyncLLM cancels that input stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servesim.scheduler import Request, RequestStatus, SamplingParams
from servesim.traces.errors import InputError
from servesim.traces.tokens import stream_tokens, text_stream
from servesim.traces.workload import RequestSpec

CLOSE_PROMPT = (0,)  # AsyncLLM's final request carries a one-token prompt nobody reads


class SessionInputs:
    """The input chunks still to come for a run's sessions, and which requests are sessions."""

    __slots__ = ("_env", "_sched", "_notify", "_records", "pending", "_live", "_parked_at")

    def __init__(self, env: Any, scheduler: Any, notify: Callable[[], None], records: dict) -> None:
        self._env, self._sched, self._notify = env, scheduler, notify
        self._records = records  # request_id -> RequestRecord: input_wait_s adds up the parked time
        self.pending = 0  # chunks not delivered yet: the run is not over while any is
        self._live: set[str] = set()
        self._parked_at: dict[str, float] = {}  # session -> when it parked (WAITING_FOR_STREAMING_REQ)

    @staticmethod
    def check(spec: RequestSpec, engine: str, has_planner: bool, frontend: bool) -> bool:
        """Whether spec is a session; refuses one where the run cannot model it."""
        if spec.input_chunk_offsets_s is None:
            return False
        if engine != "vllm" or has_planner or frontend:
            raise InputError(f"request {spec.request_id!r}: streaming input needs engine: vllm, no frontend "
                             "model and, in a cluster, macro_steps: false", field="input_chunk_offsets_s",
                             allowed="no input chunks with engine: sglang, frontend.enabled or a cluster's fast path")
        return True

    def start(self, spec: RequestSpec) -> None:
        """The session arrived: its later chunks are timed from now."""
        assert spec.input_chunk_offsets_s is not None and spec.input_chunk_lens is not None
        self._live.add(spec.request_id)
        last = len(spec.input_chunk_lens) - 1
        for j, (offset_s, num_tokens) in enumerate(zip(spec.input_chunk_offsets_s, spec.input_chunk_lens)):
            self.pending += 1
            self._at(offset_s, spec, j, num_tokens, j == last)

    def _at(self, offset_s: float, spec: RequestSpec, j: int, num_tokens: int, last: bool) -> None:
        self._env.timeout(offset_s).callbacks.append(lambda _event: self._deliver(spec, j, num_tokens, last))

    def _deliver(self, spec: RequestSpec, j: int, num_tokens: int, last: bool) -> None:
        self.pending -= 1
        rid, now = spec.request_id, self._env.now
        live = self._sched.requests.get(rid)
        parked_at = self._parked_at.pop(rid, None)
        if parked_at is not None and rid in self._records:
            record = self._records[rid]
            record.input_wait_s = (record.input_wait_s or 0.0) + now - parked_at
        if live is not None and not live.is_finished():
            ids = stream_tokens(text_stream(f"input_chunk:{rid}:{j}"), 0, num_tokens).tolist()
            sp = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
            self._sched.add_request(Request(rid, ids, sp, arrival_time=now, resumable=True), now_s=now)
            if last:  # the stream closes: the session ends with this chunk's generation
                self._sched.add_request(Request(rid, CLOSE_PROMPT, sp, arrival_time=now), now_s=now)
        self._notify()

    def is_chunk_end(self, request_id: str) -> bool:
        """A finish reason for request_id that only ends one input chunk (the session goes on)."""
        if request_id not in self._live:
            return False
        request = self._sched.requests.get(request_id)
        if request is not None and not request.is_finished():
            if request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                self._parked_at[request_id] = self._env.now
            return True
        self._live.discard(request_id)
        return False
