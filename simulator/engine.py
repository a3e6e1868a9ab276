"""The simulated engine: vLLM's EngineCore loop on a SimPy clock (the reference core).

    schedule() -> executor.execute() -> env.timeout(step time) -> update_from_output()

With async scheduling the loop keeps two steps in flight like vLLM's batch queue: step N+1 is
scheduled (its CPU work overlapping step N on the GPU) before step N's output is applied. When
nothing is waiting or running the engine sleeps until the next arrival: no busy loop.

The engine owns small objects, each with its own state: the scheduler, the executor, the
`Clients` that send the workload (simulator/client.py), the `StepBook` (rows, step-trace records,
token times, finishes: simulator/step_book.py), the `Watchdog` (simulator/watchdog.py), the
`ClientDeadlines` (simulator/deadlines.py), the `RequestEnds` (how requests end, who hears it:
simulator/request_ends.py) and the `IdleWait` (what the idle loop waits for:
simulator/idle_wait.py). A `RunPlanner` (simulator/run_planner.py) may plug in
beside the loop and apply runs of steps at once; `Engine(...)` alone has none and steps every step
(simulator/build.py attaches the fast path's). What a run hands back, `EngineResult`, is assembled
from the book by simulator/engine_result.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import IO, Any

import simpy

from servesim.scheduler import TokenProvenance
from servesim.scheduler.config import max_concurrent_batches
from servesim.scheduler.interface import SchedulerInterface
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.worker import TokenSource
from servesim.simulator.client import Clients
from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model import run_cost_model
from servesim.simulator.cost_model.pipeline import PipelineCost
from servesim.simulator.deadlines import ClientDeadlines
from servesim.simulator.engine_result import EngineResult, engine_result
from servesim.simulator.executor import Executor, SimExecutor
from servesim.simulator.finished_records import FinishedRecords
from servesim.simulator.gateway.wiring import attach_to_engine
from servesim.simulator.idle_wait import IdleWait
from servesim.simulator.kv_offload import attach_kv_offload
from servesim.simulator.liveness import Admission, StallError
from servesim.simulator.metrics import MetricsCollector
from servesim.simulator.pipeline_clock import pipeline_clock_for
from servesim.simulator.request_ends import RequestEnds
from servesim.simulator.request_factory import RequestFactory, check_multimodal
from servesim.simulator.run_planner import InFlight, RunPlanner
from servesim.simulator.sampling import sampler_cost_for
from servesim.simulator.sessions import SessionTurns
from servesim.simulator.scheduler_kinds import make_engine_scheduler
from servesim.simulator.startup import resolve_cache, resolved
from servesim.simulator.step_book import StepBook
from servesim.simulator.streaming_input import SessionInputs
from servesim.simulator.structured_output import GrammarTimes
from servesim.simulator.watchdog import Watchdog
from servesim.simulator.workload_replay import WorkloadReplay
from servesim.traces.workload import RequestSpec, Workload

__all__ = ["Engine", "InFlight", "StallError", "resolve_cache"]

NO_PLANNER = "the engine was built without a planner (Engine alone: the reference)"


class Engine:
    def __init__(self, cfg: SimConfig, workload: Workload | None = None, executor: Executor | None = None,
                 step_trace: IO[str] | None = None, progress: Callable[[float, int], None] | None = None,
                 env: simpy.Environment | None = None, name: str = "engine0",
                 on_finish: Callable[[str, str | None], None] | None = None,
                 scheduler: SchedulerInterface | None = None):
        cfg = resolved(cfg)  # start-up checks; max_model_len filled in from the model when None
        self.cfg = cfg
        self.workload = workload
        self.name = name
        self.cache, self.kv_capacity = resolve_cache(cfg)
        # A ready-made scheduler (e.g. a P/D decode scheduler) must match self.cache.
        self.scheduler: SchedulerInterface = scheduler if scheduler is not None else make_engine_scheduler(
            cfg.engine, cfg.scheduler, self.cache, cfg)
        self.kv_offload = attach_kv_offload(cfg, self.scheduler, self.cache)  # the CPU KV tier's worker, or None
        if workload is not None:
            check_multimodal(workload, cfg.engine, cfg.scheduler,
                             any(g.kind == "cross_attention" for g in self.cache.kv_cache_groups))
        hw = cfg.hardware
        if executor is None:
            cost = run_cost_model(cfg)
            pipeline = PipelineCost(cost, hw.model, hw.tp, hw.pp) if hw.pp > 1 else None
            executor = SimExecutor(cost, TokenSource(cfg.seed, cfg.spec_decode.acceptance), cfg.scheduler.num_spec_tokens,
                                   sampler=sampler_cost_for(cfg), pipeline=pipeline)
        self.executor: Executor = executor
        # Pipeline parallelism: a batch per stage in flight, timed stage by stage (pipeline_clock.py).
        self._pipeline = pipeline_clock_for(hw.pp, executor)
        # What prices a step stage by stage (pipeline_clock_for refuses any other executor with pp > 1).
        self._staged: SimExecutor | None = executor if self._pipeline is not None and isinstance(executor, SimExecutor) \
            else None
        self.requests_in = RequestFactory(executor, cfg.prefix_cache_keys == "provenance")
        self.grammar_times = GrammarTimes(cfg.structured_output, cfg.seed)
        self.admission = Admission.of(cfg.scheduler, self.cache, pool_rule=cfg.engine != "sglang")
        # Admission, grammars and sessions are interpreted: _add asks them only where they can
        # refuse or add something (most requests are within _admitted_tokens, have no grammar,
        # are not sessions)
        self._admitted_tokens = self.admission.admitted_tokens()
        self._grammar_may_block = self.grammar_times.may_block
        self.cpu = cfg.cost_model.cpu_overhead
        self.env = env if env is not None else simpy.Environment()
        self.book = StepBook(MetricsCollector(cfg.step_rows), step_trace, progress)
        # Who sends the workload's requests, when, through which frontend, and when each output
        # reaches them (simulator/client.py).
        self.clients = Clients(self.env, cfg.frontend if cfg.frontend.enabled else None, cfg.client.max_concurrency,
                               self.submit, self.expect_next_arrival, self.book.metrics)
        self.watchdog = Watchdog(cfg.liveness)
        self.deadlines = ClientDeadlines()
        # on_finish: (request_id, finish_reason) -> None, e.g. for a router (RequestEnds.on_finish)
        self.ends = RequestEnds(name, self.env, self.scheduler, self.book, self.clients, self.watchdog,
                                self.deadlines, cfg.liveness.stranded_requests, on_finish)
        # Its own workload's replay (run()) and closed-loop turns, or None (its owner submits).
        self.replay = None if workload is None else WorkloadReplay(self, workload, on_finish)
        self._timeout_s = cfg.client.timeout_s
        self.idle = IdleWait(self.env, self.scheduler, self.deadlines, self.kv_offload)
        self.gpu_free_at = 0.0  # when the GPU finishes the last submitted step
        self.in_flight: InFlight = deque()  # the loop's steps in flight (scheduled, not yet updated)
        self.planner: RunPlanner | None = None
        self.planner_declined: str | None = NO_PLANNER  # why there is no planner (None: there is one)
        # Streaming-input chunks to come (simulator/streaming_input.py).
        self.sessions = SessionInputs(self.env, self.scheduler, self.notify, self.book.metrics.requests)
        self.gateway = attach_to_engine(self)  # admission and flow control in front (None: off)

    def retire_finished_records(self) -> None:
        """The caller reads no request record after the run (only the requests table): completed
        requests' records move into columns at their finish (MetricsRecorder.retire_finished).
        Not with the frontend's serial loop, whose output jobs write a finished record later."""
        if self.clients.loop is None:
            self.book.metrics.retire_finished(FinishedRecords())

    def set_planner(self, planner: RunPlanner | None, declined: str | None) -> None:
        """Plug in a fast path (before the engine starts), or record why there is none."""
        self.planner = planner
        self.planner_declined = None if planner is not None else declined

    # --- what the engine's owners read -----------------------------------------------------------
    @property
    def metrics(self) -> MetricsCollector:
        return self.book.metrics

    @property
    def num_steps(self) -> int:
        return self.book.num_steps

    @property
    def num_preemptions(self) -> int:
        return self.book.num_preemptions

    @property
    def num_outstanding(self) -> int:
        """Requests waiting or running (a router's load signal), as stepping would show them now
        (a planner's pending run may already have finished some: RunPlanner.load_drop)."""
        n = self.scheduler.get_num_unfinished_requests()
        return n if self.planner is None else n - self.planner.load_drop()

    @property
    def num_done(self) -> int:
        """Requests finished or rejected here."""
        return self.book.num_done

    @property
    def kv_usage(self) -> float:
        """KV-cache usage (a router's signal) as stepping would show it now (a planner's pending
        run answers for the steps it has not applied: RunPlanner.planned_kv_usage)."""
        if self.planner is not None and self.planner.has_pending_run():
            return self.planner.planned_kv_usage()
        return self.scheduler.kv_cache_manager.usage

    def cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None,
                             provenance: TokenProvenance | None) -> int:
        """The scheduler's cached_prefix_tokens (a prefix-aware router's signal) as stepping would
        show it now (RunPlanner.planned_prefix_tokens, while a planner's run is pending)."""
        if self.planner is not None and self.planner.has_pending_run():
            return self.planner.planned_prefix_tokens(token_ids, lora_id, provenance)
        return self.scheduler.cached_prefix_tokens(token_ids, lora_id, provenance)

    @property
    def on_finish(self) -> Callable[[str, str | None], None] | None:
        """Who hears that a request is done here (RequestEnds.on_finish; its owner may set it)."""
        return self.ends.on_finish

    @on_finish.setter
    def on_finish(self, listener: Callable[[str, str | None], None] | None) -> None:
        self.ends.on_finish = listener

    @property
    def turns(self) -> SessionTurns | None:
        """Its own workload's closed-loop session turns (simulator/sessions.py), or None."""
        return None if self.replay is None else self.replay.turns

    # --- requests in -----------------------------------------------------------------------------
    def submit(self, spec: RequestSpec, sent_s: float | None = None) -> None:
        """A request arrives now (from the workload, or from a router in a cluster); `sent_s` is when
        its client sent it (default: now), which latencies and the client timeout count from."""
        if self.planner is not None:
            self.planner.before_submit(self.env.now)
        self._add(spec, self.env.now if sent_s is None else sent_s)
        self.idle.wake_up()

    def close(self) -> None:
        """No more requests will be submitted: the loop ends once the engine drains."""
        self.idle.close()

    def notify(self) -> None:
        """Something outside changed what the scheduler can do (a KV transfer landed, blocks freed)."""
        self.idle.wake_up()

    def expect_next_arrival(self, t_s: float) -> None:
        """The next request submitted from outside will not arrive before t_s, and nothing outside
        reads this engine's state before then (what lets a planner's runs go on: RunPlanner)."""
        if self.planner is not None:
            self.planner.expect_next_arrival(t_s)

    def expect_arrivals_by_load(self, bound: Callable[[int], float] | None) -> None:
        """A router's proof of when a request can next reach this engine (RunPlanner)."""
        if self.planner is not None:
            self.planner.expect_arrivals_by_load(bound)

    def defer_runs(self, collides: Callable[[Sequence[float]], int] | None, reads_state: bool = False) -> None:
        """Let a planner apply runs when a request is routed here (RunPlanner.defer_runs)."""
        if self.planner is not None:
            self.planner.defer_runs(collides, reads_state)

    def _add(self, spec: RequestSpec, sent_s: float) -> None:
        sched, now = self.scheduler, self.env.now
        prompt_len, output_len = spec.prompt_len, spec.output_len
        self.book.metrics.on_arrival(spec.request_id, sent_s, prompt_len, output_len)
        if output_len < 1 or prompt_len + output_len > self._admitted_tokens:  # (Admission.admitted_tokens)
            reason = self.admission.reject_reason(prompt_len, output_len)
            if reason is not None:  # the frontend refuses it: it never reaches the scheduler
                self.ends.rejected(spec.request_id, reason)
                return
        timeout_s = spec.timeout_s if spec.timeout_s is not None else self._timeout_s
        if timeout_s is not None:
            deadline_s = sent_s + timeout_s
            if deadline_s <= now:  # the client gave up while the frontend still held the request
                self.ends.gone(spec.request_id)
                return
            self.deadlines.push(deadline_s, spec.request_id)
        # (None and False without a grammar field or rate, or input chunks: what each returns then)
        compile_s = None if spec.grammar_compile_ms is None and not self._grammar_may_block else \
            self.grammar_times.compile_s(spec, self.cfg.engine, self.planner is not None)
        session = spec.input_chunk_offsets_s is not None and \
            SessionInputs.check(spec, self.cfg.engine, self.planner is not None, self.clients.loop is not None)
        req = self.requests_in.make(spec, now, structured_output=compile_s is not None, resumable=session)
        sched.add_request(req, now_s=now)
        if session:
            self.sessions.start(spec)
        self.book.arrived_since_step.append(spec.request_id)
        if compile_s is not None:  # it waits in skipped_waiting until its grammar has compiled
            self.book.metrics.requests[spec.request_id].grammar_wait_s = compile_s
            self.grammar_times.start_timer(self.env, compile_s, spec.request_id, self._grammar_ready)
        for out in sched.take_ignored_outputs():  # the scheduler's own rule (SGLang keeps a margin)
            if out.reject_reason is None:
                raise RuntimeError(f"{self.name}: the scheduler refused {out.request_id} without a reject_reason")
            self.ends.rejected(out.request_id, out.reject_reason)

    def _grammar_ready(self, request_id: str) -> None:
        self.scheduler.mark_grammar_ready(request_id)
        self.notify()

    def prefix_hits(self, spec: RequestSpec, token_ids: Sequence[int], with_cpu: bool) -> tuple[int, int]:
        """How many leading tokens of spec's prompt (token_ids) the GPU prefix cache would serve
        now, and how many more the CPU KV tier would load (0 unless with_cpu): a prefix-aware
        router's two reads of every replica at every decision, in one compiled call."""
        provenance = self.requests_in.provenance(spec, outputs=False)  # (the lookups read the prompt's)
        gpu = self.cached_prefix_tokens(token_ids, spec.lora_id, provenance)
        cpu = self.scheduler.cpu_cached_prefix_tokens(token_ids, spec.lora_id, provenance, gpu) if with_cpu else 0
        return gpu, cpu

    # --- the loop --------------------------------------------------------------------------------
    def _engine_loop(self) -> Generator[simpy.Event, Any, None]:
        env, sched, planner, idle, ends = self.env, self.scheduler, self.planner, self.idle, self.ends
        caps = sched.capabilities  # fixed at construction: read once, not per step
        depth, idle_is_stable = caps.max_steps_in_flight, caps.idle_is_stable
        pipe = self._pipeline
        if pipe is not None:  # vLLM's batch queue holds one batch per stage
            depth = max_concurrent_batches(self.cfg.hardware.pp, self.cfg.scheduler.async_scheduling)
        overlap_allowed = sched.overlap_allowed
        in_flight: InFlight = deque()
        self.in_flight = in_flight  # what a planner's run applied at an arrival leaves steps in
        self.gpu_free_at = 0.0
        while True:
            if not sched.has_unfinished_requests() and not in_flight:
                if idle.all_arrived and not self.sessions.pending:
                    return
                yield idle.wake_event()
                ends.mark_progress(env.now)  # idle time with nothing to do is no stall
                continue
            now = env.now
            if self.deadlines.is_due(now):
                ends.expire_deadlines(now)
                continue
            if planner is not None and len(in_flight) == depth - 1:  # sync: none in flight; async: one
                delays_s = planner.advance(now, in_flight)
                if planner.has_pending_run():
                    yield from planner.await_pending_run(in_flight)
                    continue
                if delays_s is not None:
                    for delay_s in delays_s:
                        yield env.timeout(delay_s)
                    if len(in_flight) == depth:  # the run left a tail step in flight behind the last
                        yield from self._apply_oldest(in_flight)
                    continue
            had_in_flight = bool(in_flight)  # their updates (applied below) may change what can run
            so = sched.schedule(now_s=now)
            rec, row = self.record_schedule(so, now)
            if self.watchdog.due(self.book.num_steps, now) and not ends.abort_stranded(now):
                raise self.watchdog.stall_error(self.name, sched, self.book.num_steps, now, self.book.num_preemptions)
            mro, gpu_s = self.executor.execute(so)
            cpu_s = self.cpu.step_s(len(so.num_scheduled_tokens), so.total_num_scheduled_tokens) if so.num_scheduled_tokens else 0.0
            # CPU preparation precedes the GPU work; with async scheduling it overlaps the previous step.
            # SGLang runs some steps serially (the consecutive-prefill exception): the CPU work of
            # this step then starts only after the GPU finished the previous one.
            serial = in_flight and not overlap_allowed(in_flight[-1][0], so)
            if pipe is None:
                start = max(now, self.gpu_free_at) + cpu_s if serial else max(now + cpu_s, self.gpu_free_at)
                self.gpu_free_at = gpu_free_at = start + gpu_s
            else:  # stage by stage (gpu_s: the executor's sum of the stages)
                staged = self._staged
                assert staged is not None
                self.gpu_free_at = gpu_free_at = pipe.submit(now, cpu_s, staged.last_stage_times_s)
            self.book.metrics.steps.set_gpu_time(row, gpu_s)
            if self.kv_offload is not None:  # the worker's copies this step, reported in its output
                mro.kv_connector_output = self.kv_offload.execute(so, gpu_free_at - gpu_s, gpu_free_at)
            in_flight.append((so, mro, gpu_free_at, rec, row))
            while in_flight and (len(in_flight) >= depth or so.total_num_scheduled_tokens == 0):
                yield from self._apply_oldest(in_flight)
            if (so.total_num_scheduled_tokens == 0 and not so.preempted_req_ids and not had_in_flight
                    and idle_is_stable and sched.has_unfinished_requests()):
                # Nothing ran and nothing changed: the same schedule() would decide the same nothing
                # again at this instant (unless the head can never be admitted: aborted, go on).
                if not ends.abort_stranded(now):
                    yield idle.idle_event()

    def _apply_oldest(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        """Wait for the oldest in-flight step's GPU end, then apply its output (a generator)."""
        so, mro, end_s, rec, row = in_flight.popleft()
        if end_s > self.env.now:
            yield self.env.timeout(end_s - self.env.now)
        self.apply_output(so, mro, rec, row)

    # --- one step's bookkeeping (the loop, a DP lockstep group and a planner call these alike) ----
    def record_schedule(self, so: SchedulerOutput, now: float) -> tuple[dict | None, int]:
        """Bookkeeping of a step just scheduled: (its step-trace record or None, its steps row)."""
        return self.book.record_schedule(so, now, self.scheduler)

    def apply_output(self, so: SchedulerOutput, mro: ModelRunnerOutput, rec: dict | None, row: int,
                     now: float | None = None) -> None:
        """Apply a step's output at `now` (default: the clock): update_from_output, token times,
        finishes, progress; `row` is its steps row."""
        if now is None:
            now = self.env.now
        if rec is None and self.planner is not None and self.planner.apply_update(so, mro, row, now):
            return
        eco = self.scheduler.update_from_output(so, mro, now_s=now)
        outputs = eco.outputs
        if outputs:
            self.ends.mark_progress(now)
            self.book.metrics.on_step_outputs(outputs, now)  # token times first: a finish reads none of them
            for out in outputs:
                if out.finish_reason is not None and not self.sessions.is_chunk_end(out.request_id):
                    self.record_finish(out.request_id, now, out.finish_reason, out.num_cached_tokens)
            self.clients.on_step_outputs(outputs, now)  # the API server carries them to the clients
        self.book.record_update(row, now, mro, eco, rec)

    def record_finish(self, request_id: str, now: float, reason: str | None, num_cached: int) -> None:
        """A request finished at `now` (its last token already recorded): RequestEnds.finished."""
        self.ends.finished(request_id, now, reason, num_cached)

    def mark_progress(self, now: float) -> None:
        """Something advanced (a planner's run's token or finish): RequestEnds.mark_progress."""
        self.ends.mark_progress(now)

    # --- run -------------------------------------------------------------------------------------
    def start(self) -> simpy.Process:
        """Start the engine loop in its environment (a cluster starts several, then runs the env)."""
        return self.env.process(self._engine_loop())

    def run(self) -> EngineResult:
        """Replay this engine's own workload to the end (single-engine use: WorkloadReplay.run)."""
        assert self.replay is not None, "an engine without a workload of its own is run by its owner"
        return self.replay.run()

    def result(self, wall_time_s: float) -> EngineResult:
        """The run's result, once its environment stopped (a cluster asks each replica)."""
        self.clients.deliver_all()  # token times as the clients see them
        return engine_result(self.book, self.env.now, wall_time_s, self.cache, self.kv_capacity,
                             self.planner_declined, self.kv_offload)
