"""The benchmark clients in front of one engine: when each request is really sent, and how it
reaches the engine.

- A workload's arrival time is when the client *wants* to send. With `client.max_concurrency`
  (vllm bench's `--max-concurrency`) a client waits for a free slot first; a slot frees when a
  request's last chunk reaches the client, or when its client gives up.
- With the frontend on (simulator/frontend.py) a sent request is handled by the API server's
  event loop (one FIFO server when `serial`) and then hops to the engine; without it the request
  reaches the engine the instant it is sent.

Latencies and client timeouts count from the send time, which `submit(spec, sent_s)` passes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import simpy

from servesim.simulator.frontend import FrontendConfig
from servesim.traces.workload import RequestSpec


class Clients:
    def __init__(self, env: simpy.Environment, frontend: FrontendConfig | None, max_concurrency: int | None,
                 submit: Callable[[RequestSpec, float], None], expect_next: Callable[[float], None]):
        self.env = env
        self.frontend = frontend
        self.max_concurrency = max_concurrency
        self._submit = submit
        self._expect_next = expect_next  # tells the engine the earliest next arrival (fast-forward bound)
        self._loop = simpy.Resource(env, capacity=1) if frontend is not None and frontend.serial else None
        self._num_open = 0  # requests sent whose answer the client still waits for
        self._slot_freed: simpy.Event | None = None
        self._num_in_frontend = 0
        self._frontend_drained: simpy.Event | None = None

    def send_all(self, requests: Iterable[RequestSpec]):
        """SimPy process: send every request at its time (or when a slot frees), then return once
        each has reached the engine."""
        env = self.env
        for spec in requests:
            if spec.arrival_time_s > env.now:
                self._expect_next(spec.arrival_time_s)
                yield env.timeout(spec.arrival_time_s - env.now)
            while self.max_concurrency is not None and self._num_open >= self.max_concurrency:
                self._slot_freed = env.event()
                yield self._slot_freed
            self._num_open += 1
            if self.frontend is None:
                self._submit(spec, env.now)
            else:
                self._num_in_frontend += 1
                env.process(self._through_frontend(spec, env.now))
        while self._num_in_frontend:
            self._frontend_drained = env.event()
            yield self._frontend_drained

    def _through_frontend(self, spec: RequestSpec, sent_s: float):
        fe, env = self.frontend, self.env
        service_s = fe.request_service_s(spec.prompt_len)
        if self._loop is not None:
            with self._loop.request() as turn:  # one event loop: FIFO, one request at a time
                yield turn
                yield env.timeout(service_s)
        else:
            yield env.timeout(service_s)
        yield env.timeout(fe.engine_hop_s)
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

    def on_done(self) -> None:
        """A request left the client (completed, or its client gave up): its slot frees once the
        client has its last chunk."""
        if self.max_concurrency is None:
            return
        delay_s = self.frontend.output_delay_s() if self.frontend is not None else 0.0
        if delay_s > 0:
            self.env.timeout(delay_s).callbacks.append(lambda _event: self._release())
        else:
            self._release()

    def _release(self) -> None:
        self._num_open -= 1
        if self._slot_freed is not None and not self._slot_freed.triggered:
            self._slot_freed.succeed()
