"""The benchmark clients in front of one engine: when each request is really sent, and how it
reaches the engine.

- A workload's arrival time is when the client *wants* to send. With `client.max_concurrency`
  (vllm bench's `--max-concurrency`) a client waits for a free slot first; a slot frees when a
  request's last chunk reaches the client, or when its client gives up.
- With the gateway on (simulator/gateway/) a sent request passes its admission rules and queue
  first: it reaches the frontend when the gateway dispatches it, or is rejected there.
- With the frontend on (simulator/frontend.py) a sent request is handled by the API server's
  event loop and then hops to the engine; without it the request reaches the engine the instant it
  is sent. With `serial` the same loop (ApiServerLoop) also carries every engine step's outputs to
  the clients (`on_step_outputs`), so the token times the client sees are each step's delivery.

Latencies and client timeouts count from the send time, which `submit(spec, sent_s)` passes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import simpy

from servesim.scheduler.output import RequestOutput
from servesim.simulator.frontend import ApiServerLoop, FrontendConfig, StepDelivery, step_delivery
from servesim.simulator.request_records import MetricsRecorder
from servesim.traces.workload import RequestSpec

if TYPE_CHECKING:
    from servesim.simulator.gateway.gateway import Gateway


class Clients:
    def __init__(self, env: simpy.Environment, frontend: FrontendConfig | None, max_concurrency: int | None,
                 submit: Callable[[RequestSpec, float], None], expect_next: Callable[[float], None],
                 metrics: MetricsRecorder):
        self.env = env
        self.frontend = frontend
        self.max_concurrency = max_concurrency
        self._submit = submit
        self._expect_next = expect_next  # tells the engine the earliest next arrival (fast-forward bound)
        self._metrics = metrics  # whose token times the frontend moves to when the client has them
        self.loop = ApiServerLoop(self._delivered) if frontend is not None and frontend.serial else None
        # vLLM's one tokenizer thread (FIFO across requests, off the event loop): when it is free.
        # Its jobs arrive as the loop finishes intakes, in nondecreasing time, so the analytic
        # FIFO is exact as the loop's is.
        self._tokenizer_free_s = 0.0
        self._outputs_delayed = False  # serial: false: the constant output delay applied (once)
        self._num_open = 0  # requests sent whose answer the client still waits for
        self._slot_freed: simpy.Event | None = None
        self._num_in_frontend = 0
        self._frontend_drained: simpy.Event | None = None
        # Admission and flow control between the clients and the frontend (simulator/gateway/), or None.
        self.gateway: Gateway | None = None
        # (request id, when its client has the last output) for each finish the serial loop
        # delivers: what releases a closed-loop session turn (simulator/sessions.py), or None.
        self.on_answer_delivered: Callable[[str, float], None] | None = None

    def send_all(self, requests: Iterable[RequestSpec]):
        """SimPy process: send every request at its time (or when a slot frees), then return once
        each has reached the engine."""
        env = self.env
        for spec in requests:
            arrival_s, now = spec.arrival_time_s, env.now
            if arrival_s > now:
                self._expect_next(arrival_s)
                yield env.timeout(arrival_s - now)
            if self.max_concurrency is None:  # no slot to wait for: send() would not wait
                self._send_now(spec)
            else:
                yield from self.send(spec)
        yield from self.drain()

    def send(self, spec: RequestSpec):
        """Send one request now (a generator: it waits for a free slot first). Several senders may
        wait at once (send_all and closed-loop session turns, simulator/sessions.py): they share
        one slot event and, woken in the order they began to wait, each checks again."""
        env = self.env
        while self.max_concurrency is not None and self._num_open >= self.max_concurrency:
            if self._slot_freed is None or self._slot_freed.triggered:
                self._slot_freed = env.event()
            yield self._slot_freed
        self._send_now(spec)

    def _send_now(self, spec: RequestSpec) -> None:
        """Send one request now (its slot taken)."""
        self._num_open += 1
        if self.gateway is None:
            self.forward(spec, self.env.now)
        else:  # the gateway admits, queues or rejects it (simulator/gateway/)
            self.gateway.offer(spec, self.env.now)

    def drain(self):
        """Wait until every request sent so far has reached the engine (a generator): what the
        gateway still holds is dispatched or rejected first."""
        if self.gateway is not None:
            yield self.gateway.drained()
        while self._num_in_frontend:
            self._frontend_drained = self.env.event()
            yield self._frontend_drained

    def forward(self, spec: RequestSpec, sent_s: float) -> None:
        """A request sent at sent_s goes on now: into the frontend, or straight to the engine."""
        if self.frontend is None:
            self._submit(spec, sent_s)
        else:
            self._num_in_frontend += 1
            self.env.process(self._through_frontend(spec, sent_s))

    def _through_frontend(self, spec: RequestSpec, sent_s: float):
        fe, env = self.frontend, self.env
        if self.loop is None:  # every request has the loop and the tokenizer to itself
            yield env.timeout(fe.request_service_s(spec.prompt_len) + fe.engine_hop_s)
        else:  # the event loop, behind every job that arrived before it, then the tokenizer thread
            parsed_s = self.loop.intake(env.now, fe.http_s) + fe.http_s
            start_s = max(parsed_s, self._tokenizer_free_s)
            self._tokenizer_free_s = start_s + fe.tokenize_s(spec.prompt_len)
            yield env.timeout(self._tokenizer_free_s + fe.engine_hop_s - env.now)
        self._submit(spec, sent_s)
        self._num_in_frontend -= 1
        if self._num_in_frontend == 0 and self._frontend_drained is not None:
            self._frontend_drained.succeed()
            self._frontend_drained = None

    @property
    def num_in_frontend(self) -> int:
        """Requests already sent that have not reached the engine yet (an arrival the announced
        next-arrival time does not bound)."""
        return self._num_in_frontend

    # --- outputs back to the clients ---------------------------------------------------------------
    def on_step_outputs(self, outputs: Sequence[RequestOutput], now: float) -> None:
        """The engine applied a step at `now` and recorded its outputs (token times, finishes, at
        engine time): with the serial loop, queue the step's output job, which moves them to when
        the clients have them."""
        loop, fe = self.loop, self.frontend
        if loop is None or not outputs:
            return
        assert fe is not None
        job = step_delivery(outputs, self._metrics.requests, now + fe.engine_hop_s, fe.output_service_s(len(outputs)))
        loop.drain(now)  # what arrived by now is served: the queue stays a hop long
        loop.post(job)
        if (self.max_concurrency is not None or self.on_answer_delivered is not None) and job.num_finished:
            # A finished request's slot frees (and its session's next turn is timed) when its client
            # has the last chunk: read the loop as the job arrives (its delivery time is known then)
            # rather than at the next intake.
            self.env.timeout(job.arrival_s - now).callbacks.append(lambda _event: loop.drain(self.env.now))

    def _delivered(self, job: StepDelivery, done_s: float) -> None:
        if self.on_answer_delivered is not None:
            for rec, fin in zip(job.records, job.finished):
                if fin:
                    self.on_answer_delivered(rec.request_id, done_s)
        if self.max_concurrency is None:
            return
        for _job in range(job.num_finished):
            self._release_after(done_s - self.env.now)

    def deliver_all(self) -> None:
        """The run is over: every output reaches its client (once, however often asked)."""
        if self.loop is not None:
            self.loop.drain(float("inf"))
        elif self.frontend is not None and not self._outputs_delayed:
            self._metrics.delay_outputs(self.frontend.output_delay_s())
            self._outputs_delayed = True

    def on_done(self, finished: bool = False) -> None:
        """A request left the client (`finished`: its last output was applied; otherwise rejected,
        or its client gave up): its slot frees once the client has its last chunk (a finish on the
        serial loop: when the step's output job delivers it, `_delivered`)."""
        if self.max_concurrency is None or (finished and self.loop is not None):
            return
        self._release_after(self.frontend.output_delay_s() if self.frontend is not None else 0.0)

    def _release_after(self, delay_s: float) -> None:
        if delay_s > 0:
            self.env.timeout(delay_s).callbacks.append(lambda _event: self._release())
        else:
            self._release()

    def _release(self) -> None:
        self._num_open -= 1
        if self._slot_freed is not None and not self._slot_freed.triggered:
            self._slot_freed.succeed()
