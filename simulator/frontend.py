"""The OpenAI-compatible frontend a benchmark client talks to (off for in-process runs).

vLLM's API server is one process running one asyncio event loop. Two kinds of work share it:

- intake, per request: HTTP parse and validation (the loop), then tokenization, which vLLM runs
  off the loop on one tokenizer thread (``AsyncMicrobatchTokenizer``: a single-thread executor "so
  the event loop stays responsive"), then the hop to EngineCore;
- output, per engine step that produced outputs: AsyncLLM's output_handler pulls the step's
  EngineCoreOutputs, OutputProcessor.process_outputs detokenizes each request's new tokens and
  builds its RequestOutput, and each request's streaming generator serializes an SSE chunk and
  writes it (one chunk per request per step: stream_interval 1).

    client send --> [loop: http_s] --> [tokenizer thread: tokenize] --(engine_hop_s)--> EngineCore.add_request
    EngineCore step output --(engine_hop_s)--> [loop: output_step_s + output_per_request_s x n] --> client

With `serial: true` (the default) `ApiServerLoop` serves both kinds as one FIFO queue in arrival
order, so a new request waits behind the streaming of everything running, and a step's tokens
reach their clients only when the loop has worked through that step's outputs. EngineCore is
another process: the loop never slows the engine. With `serial: false` every request has the loop
to itself (the independent model): intake costs delay each request alone and every output reaches
its client a constant `output_delay_s()` after the engine produced it.

simulator/client.py drives the loop (intake when a client sends, a step's output job when the
engine applies it); the defaults' sources are in docs/FRONTEND.md. For numbers that match a
particular server, measure it with `servesim calibrate-frontend`.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servesim.scheduler.output import RequestOutput
from servesim.simulator.request_records import RequestRecord
from servesim.traces.errors import InputError

_COSTS_S = ("http_s", "tokenize_base_s", "tokenize_s_per_token", "engine_hop_s", "output_step_s",
            "output_per_request_s")


@dataclass(slots=True)
class FrontendConfig:
    enabled: bool = False  # model the API server (runs measured by an HTTP benchmark client)
    # Defaults are orders of magnitude, not fits (docs/FRONTEND.md cites each).
    http_s: float = 0.001  # per request: HTTP parse, validation, routing (s)
    tokenize_base_s: float = 0.0002  # per request: tokenizer call overhead (s)
    tokenize_s_per_token: float = 1.0e-6  # per prompt token (s)
    engine_hop_s: float = 0.0005  # API server <-> EngineCore (ZMQ + msgpack), each way (s)
    output_step_s: float = 1.0e-4  # per engine step with outputs: output_handler's pass over the batch (s)
    output_per_request_s: float = 5.0e-5  # per request in that step: detokenize, RequestOutput, SSE chunk (s)
    serial: bool = True  # intake and output work share one event loop (ApiServerLoop)
    # Deprecated: the per-chunk cost of the constant-delay model; read as output_per_request_s.
    chunk_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("enabled", "serial"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"got {getattr(self, name)!r}", field=f"frontend.{name}", allowed="true or false")
        if self.chunk_s is not None:
            _check_cost("chunk_s", self.chunk_s)
            warnings.warn("frontend.chunk_s is deprecated: it is now frontend.output_per_request_s (per request "
                          "in each engine step's output), beside frontend.output_step_s (per step)",
                          DeprecationWarning, stacklevel=3)
            self.output_per_request_s = float(self.chunk_s)
            self.chunk_s = None
        for name in _COSTS_S:
            _check_cost(name, getattr(self, name))

    def request_service_s(self, prompt_len: int) -> float:
        """One request's whole intake before it hops to the engine, with nothing queued (s)."""
        return self.http_s + self.tokenize_s(prompt_len)

    def tokenize_s(self, prompt_len: int) -> float:
        """The tokenizer thread's time for one prompt (s)."""
        return self.tokenize_base_s + self.tokenize_s_per_token * prompt_len

    def output_service_s(self, num_requests: int) -> float:
        """Event-loop time of one engine step's outputs for `num_requests` requests (s)."""
        return self.output_step_s + self.output_per_request_s * num_requests

    def output_delay_s(self) -> float:
        """Engine output -> the client has the chunk, on a loop with nothing else to do (s): the
        constant delay of `serial: false`."""
        return self.engine_hop_s + self.output_service_s(1)


def _check_cost(name: str, value: object) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise InputError(f"got {value!r}", field=f"frontend.{name}", allowed="a finite number >= 0 (s)")


@dataclass(slots=True)
class StepDelivery:
    """One engine step's outputs on their way through the loop: which token times they move.

    records[i] got num_tokens[i] tokens at positions first_index[i].. of its token_times_s (engine
    times until delivered); finished[i]: that output was the request's last."""
    arrival_s: float  # when the step's outputs reach the loop (engine time + hop)
    service_s: float
    records: list[RequestRecord]
    first_index: list[int]
    num_tokens: list[int]
    finished: list[bool]

    @property
    def num_finished(self) -> int:
        return sum(self.finished)

    def deliver(self, done_s: float) -> None:
        """The clients have the step's chunks at done_s: their token times (and first-token and
        finish times) become done_s."""
        for rec, start, n, fin in zip(self.records, self.first_index, self.num_tokens, self.finished):
            times = rec.token_times_s
            for j in range(start, start + n):
                times[j] = done_s
            if n and start == 0:
                rec.first_token_s = done_s
            if fin:
                rec.finish_s = done_s
            rec.itl_s = None  # the gaps a frame cached (none yet during a run) are stale


class ApiServerLoop:
    """vLLM's API server event loop as one FIFO server: `done = max(busy_until, arrival) + service`.

    Jobs are served in arrival order, ties in submission order (`num_jobs` counts them). The
    analytic form is exact because no job is ever submitted with an arrival earlier than one
    already served: an intake arrives the instant it is submitted (the SimPy clock), a step's
    output job `engine_hop_s` after the engine applied the step, and the engine applies steps in
    clock order. Output jobs wait in `_pending` (arrivals nondecreasing) until something reads the
    loop at or after their arrival (`drain`): an intake, a tick the client sets for a finish, or
    the end of the run."""

    __slots__ = ("busy_until_s", "num_jobs", "_pending", "_on_delivered")

    def __init__(self, on_delivered: Callable[[StepDelivery, float], None] | None = None) -> None:
        self.busy_until_s = 0.0  # when the loop finishes the last job served so far
        self.num_jobs = 0
        self._pending: deque[StepDelivery] = deque()
        self._on_delivered = on_delivered  # (job, done_s) after its token times moved

    def intake(self, arrival_s: float, service_s: float) -> float:
        """Serve a request's intake arriving now (after every output job that arrived before it or
        with it); returns when the loop starts it."""
        self.drain(arrival_s)
        start_s = max(self.busy_until_s, arrival_s)
        self.busy_until_s = start_s + service_s
        self.num_jobs += 1
        return start_s

    def post(self, job: StepDelivery) -> None:
        """Queue a step's output job (its arrival no earlier than any queued before it)."""
        assert not self._pending or job.arrival_s >= self._pending[-1].arrival_s
        self._pending.append(job)

    def drain(self, upto_s: float) -> None:
        """Serve the queued output jobs that arrived by upto_s (the caller's clock: nothing can
        still arrive before it)."""
        pending = self._pending
        while pending and pending[0].arrival_s <= upto_s:
            job = pending.popleft()
            done_s = self.busy_until_s = max(self.busy_until_s, job.arrival_s) + job.service_s
            self.num_jobs += 1
            job.deliver(done_s)
            if self._on_delivered is not None:
                self._on_delivered(job, done_s)


def step_delivery(outputs: Sequence[RequestOutput], records: dict[str, RequestRecord], arrival_s: float,
                  service_s: float) -> StepDelivery:
    """The output job of a step whose outputs were just recorded (each request's new token times
    are the last len(new_token_ids) of its token_times_s)."""
    recs, first, nums, fins = [], [], [], []
    for out in outputs:
        rec = records[out.request_id]
        n = len(out.new_token_ids)
        recs.append(rec)
        first.append(len(rec.token_times_s) - n)
        nums.append(n)
        fins.append(out.finish_reason is not None)
    return StepDelivery(arrival_s, service_s, recs, first, nums, fins)
