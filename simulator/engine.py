"""The simulated engine: vLLM's EngineCore loop on a SimPy clock.

    schedule() -> executor.execute() -> env.timeout(step time) -> update_from_output()

With async scheduling the loop keeps two steps in flight like vLLM's batch queue: step N+1 is
scheduled (its CPU work overlapping step N on the GPU) before step N's output is applied. When
nothing is waiting or running the engine sleeps until the next arrival: no busy loop.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import simpy

from servesim.scheduler import (CacheConfig, LazyTokenIds, Request, SamplingParams, TokenProvenance,
                                TokenSegment)
from servesim.scheduler.bulk import decode_runs_for
from servesim.scheduler.config import max_concurrent_batches
from servesim.scheduler.interface import SchedulerInterface
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.simulator.scheduler_kinds import make_engine_scheduler
from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model import make_cost_model
from servesim.simulator.cost_model.pipeline import PipelineCost
from servesim.simulator.executor import Executor, SimExecutor
from servesim.simulator.client import Clients
from servesim.simulator.kv_capacity import KvCapacity
from servesim.simulator.liveness import Admission, StallError
from servesim.simulator.macro_step import MacroStepMixin, macro_fallback_reason
from servesim.simulator.metrics import MetricsCollector
from servesim.simulator.pipeline_clock import pipeline_clock_for
from servesim.simulator.sampling import sampler_cost_for
from servesim.simulator.startup import resolve_cache, resolved
from servesim.scheduler.worker import TokenSource
from servesim.traces.workload import RequestSpec, Workload


__all__ = ["Engine", "EngineResult", "StallError", "resolve_cache"]

# The loop's steps in flight, oldest first: (schedule, its output, GPU end s, step-trace record, steps row)
InFlight = deque[tuple[SchedulerOutput, ModelRunnerOutput, float, "dict | None", int]]


@dataclass(slots=True)
class EngineResult:
    metrics: MetricsCollector
    sim_duration_s: float  # from the first arrival (t=0) to the last finish
    wall_time_s: float
    num_steps: int
    prefix_hits: int  # tokens, requests never preempted (vLLM's hit-rate definition)
    prefix_queries: int
    cache: CacheConfig
    kv_capacity: KvCapacity | None


class Engine(MacroStepMixin):
    def __init__(self, cfg: SimConfig, workload: Workload | None = None, executor: Executor | None = None,
                 step_trace: IO[str] | None = None, progress: Callable[[float, int], None] | None = None,
                 env: simpy.Environment | None = None, name: str = "engine0",
                 on_finish: Callable[[str, str | None], None] | None = None,
                 scheduler: SchedulerInterface | None = None):
        cfg = resolved(cfg)  # start-up checks; max_model_len filled in from the model when None
        self.cfg = cfg
        self.workload = workload
        self.name = name
        self.on_finish = on_finish  # (request_id, finish_reason) -> None, e.g. for a router
        self.cache, self.kv_capacity = resolve_cache(cfg)
        # A ready-made scheduler (e.g. a P/D decode scheduler) must match self.cache.
        self.scheduler = scheduler if scheduler is not None else make_engine_scheduler(
            cfg.engine, cfg.scheduler, self.cache, cfg)
        hw = cfg.hardware
        if executor is None:
            cost = make_cost_model(cfg.cost_model.name, model=hw.model, gpu=hw.gpu, tp=hw.tp, **cfg.cost_model.params)
            pipeline = PipelineCost(cost, hw.model, hw.tp, hw.pp) if hw.pp > 1 else None
            executor = SimExecutor(cost, TokenSource(cfg.seed, cfg.spec_decode.acceptance), cfg.scheduler.num_spec_tokens,
                                   sampler=sampler_cost_for(cfg), pipeline=pipeline)
        self.executor = executor
        self._sim = executor if isinstance(executor, SimExecutor) else None  # what macro-steps price and sample with
        # Pipeline parallelism: a batch per stage in flight, timed stage by stage (pipeline_clock.py).
        self._pipeline = pipeline_clock_for(hw.pp, executor)
        self._keys_from_provenance = cfg.prefix_cache_keys == "provenance"
        self.admission = Admission.of(cfg.scheduler, self.cache, pool_rule=cfg.engine != "sglang")
        self.cpu = cfg.cost_model.cpu_overhead
        self.env = env if env is not None else simpy.Environment()
        self._frontend = cfg.frontend if cfg.frontend.enabled else None
        self._outputs_delayed = False
        # Who sends the workload's requests, when, and through which frontend (simulator/client.py).
        self.clients = Clients(self.env, self._frontend, cfg.client.max_concurrency, self.submit,
                               self.expect_next_arrival)
        self.metrics = MetricsCollector()
        self.step_trace = step_trace
        self.progress = progress
        self._wake = None  # what the idle loop waits for (an arrival, close() or notify() triggers it)
        self._arrived_since_step = []
        self._all_arrived = False
        self._num_done = 0
        self.num_steps = 0
        self.prefix_hits = 0
        self.prefix_queries = 0
        self._gpu_free_at = 0.0  # when the GPU finishes the last submitted step
        # Arrival the engine's own arrival process waits for; 0 = unknown (requests come from outside).
        self._next_arrival_s = 0.0
        self._arrival_bound = None  # expect_arrivals_by_load
        self._macro_until_s = -1.0  # the last update time of the last macro-step
        self._collides = None  # defer_runs (deferred_run.py)
        self._deferred = None  # the planned run not yet applied
        self._in_flight = deque()  # the loop's steps in flight (scheduled, not yet updated)
        self.num_deferred_runs = 0  # planned
        self.num_deferred_routed = 0  # applied at a routed arrival
        # Watchdog: the step count and clock past which no progress means a stall (see _mark_progress).
        self.num_preemptions = 0
        self._max_steps_idle = cfg.liveness.max_steps_without_progress
        self._max_s_idle = cfg.liveness.max_sim_s_without_progress
        self._stall_step = 0  # the step count ...
        self._stall_s = 0.0  # ... and the clock past which no progress means a stall
        self._preemptions_at_progress = 0
        self._mark_progress(0.0)
        self._timeout_s = cfg.client.timeout_s
        # Client deadlines still pending: (deadline s, submission seq, request id); a heap. An entry
        # whose request already finished is dropped when it comes due.
        self._deadlines = []
        self._num_submitted = 0
        # Exact macro-steps (simulator/macro_step.py) through the bulk decode path the scheduler
        # declares (scheduler/bulk/), built once; reason None = they may apply, run by run.
        self._decode_runs = decode_runs_for(self.scheduler) if cfg.macro_steps else None
        self.macro_fallback_reason = macro_fallback_reason(self)
        if self.macro_fallback_reason is not None:
            self._decode_runs = None
        runs = self._decode_runs
        self._decode_run_extra = runs.decode_run_extra_steps() if runs is not None else 0
        # a run's last update may land past an arrival (macro_step.py, _past_arrival)
        self._commuting_arrivals = runs is not None and runs.arrivals_commute_with_decode_updates()
        self.num_macro_steps = 0  # engine steps applied inside macro-steps
        self.num_macro_runs = 0  # runs of two or more steps applied (sync or async, eager or deferred)
        self.num_runs_past_arrival = 0  # runs whose last update was due after an arrival (_past_arrival)
        self.num_bulk_finishes = 0  # requests finished inside a run's bulk update (not a stepped one)

    # --- processes -----------------------------------------------------------------------------
    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        yield from self.clients.send_all(self.workload.requests)
        self._next_arrival_s = float("inf")
        self.close()

    def submit(self, spec: RequestSpec, sent_s: float | None = None) -> None:
        """A request arrives now (from the workload, or from a router in a cluster); `sent_s` is when
        its client sent it (default: now), which latencies and the client timeout count from."""
        if self._deferred is not None:  # a deferred run: apply it up to this arrival (deferred_run.py)
            self._apply_deferred(self.env.now, self._in_flight)
        if not self.env.now > self._macro_until_s:  # a macro-step's bound was wrong: not exact
            raise AssertionError(f"{self.name}: a request arrived inside a macro-step (before "
                                 f"{self._macro_until_s!r} s)")
        self._add(spec, self.env.now if sent_s is None else sent_s)
        self._wake_up()

    def close(self) -> None:
        """No more requests will be submitted: the loop ends once the engine drains."""
        self._all_arrived = True
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def notify(self) -> None:
        """Something outside changed what the scheduler can do (a KV transfer landed, blocks freed)."""
        self._wake_up()

    def expect_next_arrival(self, t_s: float) -> None:
        """The next request submitted from outside will not arrive before t_s, and nothing outside
        reads this engine's state before then (a cluster's router: macro-steps apply a run's first
        update early, which may finish requests); lets macro-steps run."""
        self._next_arrival_s = t_s

    def expect_arrivals_by_load(self, bound: Callable[[int], float] | None) -> None:
        """A router's proof of when a request can next reach this engine: bound(load) is the
        earliest such time while this engine's num_outstanding stays >= load (a cluster sets it;
        macro-steps then run past arrivals that provably go elsewhere)."""
        self._arrival_bound = bound

    def _idle_wait(self) -> simpy.Event:
        """Nothing ran and nothing is in flight: sleep until an outside event, or until the
        scheduler's own next state change (e.g. a policy releasing held KV)."""
        self._wake = self.env.event()
        wakes = []
        own = self.scheduler.next_event_s()
        if own is not None:
            wakes.append(own)
        if self._deadlines:  # a client giving up frees KV: that can unblock the others
            wakes.append(self._deadlines[0][0])
        if wakes:
            return self.env.any_of([self._wake, self.env.timeout(max(min(wakes) - self.env.now, 0.0))])
        return self._wake

    @property
    def num_outstanding(self) -> int:
        """Requests waiting or running (a router's load signal), as stepping would show them now
        (a deferred run's first update may finish some: deferred_run.py)."""
        n = self.scheduler.get_num_unfinished_requests()
        return n if self._deferred is None else n - self._deferred_load_drop()  # routers read it often

    @property
    def num_done(self) -> int:
        """Requests finished or rejected here."""
        return self._num_done

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv_cache_manager.usage

    def _add(self, spec: RequestSpec, sent_s: float) -> None:
        sched, now = self.scheduler, self.env.now
        self.metrics.on_arrival(spec.request_id, sent_s, spec.prompt_len, spec.output_len)
        reason = self.admission.reject_reason(spec.prompt_len, spec.output_len)
        if reason is not None:  # the frontend refuses it: it never reaches the scheduler
            self._rejected(spec.request_id, reason)
            return
        timeout_s = spec.timeout_s if spec.timeout_s is not None else self._timeout_s
        if timeout_s is not None:
            deadline_s = sent_s + timeout_s
            if deadline_s <= now:  # the client gave up while the frontend still held the request
                self.metrics.on_timeout(spec.request_id)
                self._finished_elsewhere(spec.request_id)
                return
            heapq.heappush(self._deadlines, (deadline_s, self._num_submitted, spec.request_id))
        self._num_submitted += 1
        req = Request(spec.request_id, self._prompt_ids(spec), SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
                      arrival_time=now, priority=spec.priority, lora_id=spec.lora_id,
                      job_id=spec.session_id, is_last_step=spec.is_last_turn,
                      token_provenance=self.token_provenance(spec))  # add_request keys its blocks
        sched.add_request(req, now_s=now)
        self._arrived_since_step.append(spec.request_id)
        for out in sched.take_ignored_outputs():  # the scheduler's own rule (SGLang keeps a margin)
            self._rejected(out.request_id, self.admission.scheduler_refusal_reason())

    @staticmethod
    def _prompt_ids(spec: RequestSpec) -> Sequence[int] | LazyTokenIds:
        """A trace's real ids as they are; a synthetic prompt's ids built only if something reads
        them (the simulated engine reads their count and, with provenance keys, nothing else)."""
        if spec.prompt_token_ids is not None:
            return spec.token_id_array()
        return LazyTokenIds(spec.prompt_len, spec.token_id_array)

    def token_provenance(self, spec: RequestSpec) -> TokenProvenance | None:
        """Where spec's ids come from, for keying its KV blocks without hashing them (None: hash
        them; real ids, or prefix_cache_keys: token_ids)."""
        runs = spec.token_segments() if self._keys_from_provenance else None
        if runs is None:
            return None
        return TokenProvenance(tuple([TokenSegment(*run) for run in runs]),
                               self.executor.output_token_source(spec.request_id))

    def _engine_loop(self) -> Generator[simpy.Event, Any, None]:
        env, sched = self.env, self.scheduler
        caps = sched.capabilities  # fixed at construction: read once, not per step
        depth, idle_is_stable = caps.max_steps_in_flight, caps.idle_is_stable
        pipe = self._pipeline
        if pipe is not None:  # vLLM's batch queue holds one batch per stage
            depth = max_concurrent_batches(self.cfg.hardware.pp, self.cfg.scheduler.async_scheduling)
        overlap_allowed = sched.overlap_allowed
        macro = self.macro_fallback_reason is None
        in_flight: InFlight = deque()
        self._in_flight = in_flight  # what a deferred run applied at an arrival leaves steps in
        self._gpu_free_at = 0.0
        while True:
            if not sched.has_unfinished_requests() and not in_flight:
                if self._all_arrived:
                    return
                self._wake = env.event()
                yield self._wake
                self._mark_progress(env.now)  # idle time with nothing to do is no stall
                continue
            now = env.now
            if self._deadlines and self._deadlines[0][0] <= now:
                self._expire_deadlines(now)
                continue
            if macro and len(in_flight) == depth - 1:  # sync: none in flight; async: one
                delays_s = self._macro_step(now, in_flight)
                if self._deferred is not None:
                    yield from self._await_deferred(in_flight)
                    continue
                if delays_s is not None:
                    for delay_s in delays_s:
                        yield env.timeout(delay_s)
                    if len(in_flight) == depth:  # the run ended with a tail step (macro_step.py)
                        yield from self._apply_oldest(in_flight)
                    continue
            had_in_flight = bool(in_flight)  # their updates (applied below) may change what can run
            so = sched.schedule(now_s=now)
            rec, row = self._on_schedule(so, now)
            if self.num_steps > self._stall_step or now > self._stall_s:
                self._stall(now)
            mro, gpu_s = self.executor.execute(so)
            cpu_s = self.cpu.step_s(len(so.num_scheduled_tokens), so.total_num_scheduled_tokens) if so.num_scheduled_tokens else 0.0
            # CPU preparation precedes the GPU work; with async scheduling it overlaps the previous step.
            # SGLang runs some steps serially (the consecutive-prefill exception): the CPU work of
            # this step then starts only after the GPU finished the previous one.
            serial = in_flight and not overlap_allowed(in_flight[-1][0], so)
            if pipe is None:
                start = max(now, self._gpu_free_at) + cpu_s if serial else max(now + cpu_s, self._gpu_free_at)
                self._gpu_free_at = gpu_free_at = start + gpu_s
            else:  # stage by stage (gpu_s: the executor's sum of the stages)
                self._gpu_free_at = gpu_free_at = pipe.submit(now, cpu_s, self._sim_executor().last_stage_times_s)
            self.metrics.steps.set_gpu_time(row, gpu_s)
            in_flight.append((so, mro, gpu_free_at, rec, row))
            while in_flight and (len(in_flight) >= depth or so.total_num_scheduled_tokens == 0):
                yield from self._apply_oldest(in_flight)
            if (so.total_num_scheduled_tokens == 0 and not so.preempted_req_ids and not had_in_flight
                    and idle_is_stable and sched.has_unfinished_requests()):
                # Nothing ran and nothing changed: the same schedule() would decide the same nothing
                # again at this instant.
                yield self._idle_wait()

    def _apply_oldest(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        """Wait for the oldest in-flight step's GPU end, then apply its output (a generator)."""
        so, mro, end_s, rec, row = in_flight.popleft()
        if end_s > self.env.now:
            yield self.env.timeout(end_s - self.env.now)
        self._on_update(so, mro, rec, row)

    # --- bookkeeping ---------------------------------------------------------------------------
    # --- run -----------------------------------------------------------------------------------
    def start(self) -> simpy.Process:
        """Start the engine loop in its environment (a cluster starts several, then runs the env)."""
        return self.env.process(self._engine_loop())

    def run(self) -> EngineResult:
        """Replay this engine's own workload to the end (single-engine use)."""
        t0 = time.perf_counter()
        self.env.process(self._arrivals())
        proc = self.start()
        # The run ends with an event the loop's end triggers, not the process itself: SimPy's
        # error for a run out of events names its `until` by the generator's __name__, which a
        # compiled generator has not. (A failed loop still raises its own error.)
        done = self.env.event()

        def end(_event: simpy.Event) -> None:
            done.succeed()

        proc.callbacks.append(end)
        try:
            self.env.run(until=done)
        except RuntimeError:
            if proc.triggered:
                raise
            # SimPy ran out of events with the loop still waiting: nothing could ever wake it.
            self.raise_stall("the engine is idle with requests unfinished and nothing left that could wake it "
                             "(no arrival, no KV transfer, no pin expiry)")
        return self.result(time.perf_counter() - t0)

    def result(self, wall_time_s: float) -> EngineResult:
        if self._frontend is not None and not self._outputs_delayed:
            # The client sees every chunk after the return trip and SSE (once, however often asked).
            self.metrics.delay_outputs(self._frontend.output_delay_s())
            self._outputs_delayed = True
        end = max([r.finish_s for r in self.metrics.requests.values() if r.finish_s is not None], default=0.0)
        if self.progress is not None:
            self.progress(self.env.now, self._num_done)
        return EngineResult(self.metrics, end, wall_time_s, self.num_steps, self.prefix_hits,
                            self.prefix_queries, self.cache, self.kv_capacity)
