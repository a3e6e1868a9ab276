"""Closed-loop workloads: N clients, each sends its next request when its previous one finishes.

This is how fixed-concurrency benchmarks (aiconfigurator's silicon sweeps, vLLM's
`--max-concurrency`) load a server. Requests are built on the fly, so arrival times depend on the
simulated latencies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.engine import Engine
from servesim.simulator.engine_result import EngineResult
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec


@dataclass(slots=True, frozen=True)
class ClosedLoopConfig:
    num_clients: int  # concurrency
    prompt_len: int  # tokens per request (fixed ISL)
    output_len: int  # tokens per request (fixed OSL)
    requests_per_client: int = 4  # each client sends this many requests in sequence
    think_time_s: float = 0.0  # pause between a response and the client's next request
    warmup_requests_per_client: int = 1  # excluded from the reported statistics

    def __post_init__(self) -> None:
        for f in ("num_clients", "prompt_len", "output_len", "requests_per_client"):
            if getattr(self, f) < 1:
                raise InputError(f"must be >= 1, got {getattr(self, f)}", field=f"closed_loop.{f}")
        if not 0 <= self.warmup_requests_per_client < self.requests_per_client:
            raise InputError("must be >= 0 and < requests_per_client", field="closed_loop.warmup_requests_per_client")
        if self.think_time_s < 0:
            raise InputError("must be >= 0", field="closed_loop.think_time_s")


@dataclass(slots=True)
class ClosedLoopResult:
    engine: EngineResult
    measured_ids: list[str]  # request ids after each client's warm-up


def run_closed_loop(cfg: SimConfig, cl: ClosedLoopConfig, offsets: list[float] | None = None) -> ClosedLoopResult:
    """Run the closed loop. `offsets`: each client's start time in seconds (validation's staggered
    clients); None: every client sends at t=0.

    The two start modes also resubmit differently, and both are kept as they were validated (the
    fidelity tables were measured with them): the t=0 loop sends a client's next request from a new
    SimPy process (after an optional think time), staggered clients from inside the finish callback."""
    sent = [0] * cl.num_clients
    owner: dict[str, int] = {}
    measured: list[str] = []
    finished = [0]
    engine: Engine | None = None

    def spec_for(client: int, now: float) -> RequestSpec:
        k = sent[client]
        sent[client] += 1
        rid = f"c{client:04d}-{k:04d}"
        owner[rid] = client
        if k >= cl.warmup_requests_per_client:
            measured.append(rid)
        return RequestSpec(rid, now, prompt_len=cl.prompt_len, output_len=cl.output_len)

    def on_finish(request_id: str, reason) -> None:
        client = owner[request_id]
        finished[0] += 1
        if sent[client] < cl.requests_per_client:
            if offsets is None:
                engine.env.process(_send_later(client))
            else:
                engine.submit(spec_for(client, engine.env.now))
        if finished[0] == cl.num_clients * cl.requests_per_client:
            engine.close()  # every client is done: let the loop end once the engine drains

    def _send_later(client: int):
        if cl.think_time_s:
            yield engine.env.timeout(cl.think_time_s)
        engine.submit(spec_for(client, engine.env.now))

    def _start_at(client: int, delay: float):
        if delay > 0:
            yield engine.env.timeout(delay)
        engine.submit(spec_for(client, engine.env.now))

    engine = build_engine(cfg, None, on_finish=on_finish)
    t0 = time.perf_counter()
    for c in range(cl.num_clients):
        if offsets is None:
            engine.submit(spec_for(c, 0.0))
        else:
            engine.env.process(_start_at(c, offsets[c]))
    engine.env.run(until=engine.start())
    return ClosedLoopResult(engine.result(time.perf_counter() - t0), measured)
