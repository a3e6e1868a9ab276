"""Data-parallel deployments as vLLM runs them for MoE models (``--data-parallel-size N``).

vLLM's data parallelism (docs "Data Parallel Deployment"): N engine cores, each with its own
scheduler and KV cache, share one set of expert-parallel MoE layers. The front end balances
requests over the ranks; every forward pass is a collective across ranks (the MoE all-to-all),
so ranks step together and a rank with nothing to do runs a dummy batch to take part.

servesim models this as N replicas behind the ``vllm_dp`` router, each replica's cost model told
the group's size (``data_parallel_size``) and ``all2all_backend`` (how the MoE layers dispatch and
combine: cost_model/moe_comm.py). With ``lockstep=True`` (the default of ``dp_cluster_config``)
the ranks also step together: one process drives them wave by wave, each wave as long as its
slowest rank, idle ranks running dummy batches, and every rank's MoE layers see the wave's real
token total (:class:`LockstepGroup`). Free-running ranks (``lockstep=False``) cannot know each
other's batches: their cost model assumes N x their own tokens (balanced ranks, which the router
aims for).
"""

from __future__ import annotations

import dataclasses
from collections import deque

from servesim.simulator.cluster.config import ClusterConfig, ReplicaGroup, RouterConfig
from servesim.simulator.cluster.routers import Decision, Router, _least, register_router
from servesim.simulator.cost_model.base import wave_corrector
from servesim.simulator.cost_model.cudagraph import default_capture_sizes, padded_tokens
from servesim.scheduler.step_shape import StepShape
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.traces.errors import InputError


@register_router("vllm_dp")
class VllmDataParallelBalancer(Router):
    """vLLM's DP load balancer (v1 ``DPLBAsyncMPClient``): the rank with the lowest
    ``4 x waiting + running``, ties to the lowest index."""

    def __init__(self, rng) -> None:
        pass

    def choose(self, spec, candidates, now_s):
        keys = []
        for c in candidates:
            running, waiting = c.engine.scheduler.get_queue_lengths()
            keys.append((4 * waiting + running,))
        i = _least(keys)
        return Decision(i, "dp_balance", float(keys[i][0]))


def dp_cluster_config(sim: SimConfig, data_parallel_size: int, *, expert_parallel: bool = True,
                      seed: int = 0, lockstep: bool = True) -> ClusterConfig:
    """A ``data_parallel_size``-rank deployment of ``sim`` (each rank: its TP group); with
    ``lockstep`` the ranks step together as vLLM's MoE DP ranks do (:class:`LockstepGroup`)."""
    if not isinstance(data_parallel_size, int) or data_parallel_size < 1:
        raise InputError(f"got {data_parallel_size!r}", field="data_parallel_size",
                         allowed="an integer >= 1")
    cm = sim.cost_model
    if cm.name != "roofline":
        raise InputError("data-parallel MoE deployments are costed by the roofline cost model "
                         "(its MoE tables and collectives)", field="cost_model", allowed="roofline")
    ep = sim.hardware.tp * data_parallel_size if expert_parallel else 1
    params = {**cm.params, "data_parallel_size": data_parallel_size, "expert_parallel_size": ep}
    rank = dataclasses.replace(sim, cost_model=CostModelConfig(name=cm.name, params=params,
                                                               cpu_overhead=cm.cpu_overhead))
    return ClusterConfig(replicas=[ReplicaGroup(count=data_parallel_size, sim=rank, name="dp",
                                                   lockstep=lockstep)],
                         router=RouterConfig("vllm_dp"), seed=seed)


class LockstepGroup:
    """The ranks of one DP group stepping together, as vLLM runs DP for MoE models.

    vLLM (docs "Data Parallel Deployment"): forward passes must be aligned, the expert layers of
    all ranks synchronise in every forward pass, and while any rank has requests in progress every
    rank without scheduled work runs an empty "dummy" forward pass. So step k starts on every rank
    at once and ends when the slowest rank's step k ends. One SimPy process drives the group's
    engines (instead of one loop per engine), wave by wave:

    * every rank with unfinished requests schedules (its own scheduler and KV cache); a rank that
      has none, or schedules nothing, runs a dummy batch: one token, nothing sampled
      (``dummy_shape``), costed by its own cost model;
    * the wave's GPU time is the maximum over the ranks' step times (dummies included), each
      with its MoE layers holding the wave's tokens (:func:`wave_tokens`: vLLM's dispatch gathers
      every rank's tokens, padded to the largest rank's CUDA-graph size when every rank's batch
      runs a graph) through the cost model's
      ``wave_correction_s`` (cost_model/base.py WaveCostModel; models without it are used as
      they are); its CPU time the maximum of the ranks' CPU overheads; with async scheduling
      (two steps in flight) the next wave is scheduled while this one runs, exactly as one
      engine does (``start = max(now + cpu, gpu_free_at)``), and outputs are applied in wave
      order;
    * when no rank has work the group sleeps until a request arrives (vLLM's ranks also stop
      stepping then; its every-32-steps global "unfinished?" check is not modelled, nor the
      fast-forward and the stall watchdog of a single engine).

    Every rank's step record carries the wave's GPU time.
    """

    def __init__(self, engines: list) -> None:
        if not engines:
            raise InputError("a lockstep group needs at least one engine", field="replicas")
        if any(e.cfg.hardware.pp > 1 for e in engines):  # the group's loop times one stage per rank
            raise InputError("data-parallel ranks stepping in lockstep with pipeline stages are not modelled",
                             field="hardware.pp", allowed="1 in a lockstep (DP) group")
        self.engines = engines
        self.env = engines[0].env
        self.num_waves = 0
        self.num_dummy_steps = 0  # rank-steps spent in dummy batches
        self._dummy_s = [e.executor.cost_model.step_time_s(dummy_shape()) for e in engines]
        self._wave_fix = [wave_corrector(e.executor.cost_model) for e in engines]
        sched = engines[0].cfg.scheduler  # one DP group: every rank runs the same engine settings
        self._graph_sizes = default_capture_sizes(sched.max_num_seqs, sched.max_num_batched_tokens)

    def start(self):
        return self.env.process(self._loop())

    def _wait_any(self, events: list):
        return self.env.any_of(events)

    def _loop(self):
        env, engines = self.env, self.engines
        depth = engines[0].scheduler.capabilities.max_steps_in_flight
        in_flight: deque = deque()
        gpu_free_at = 0.0
        while True:
            busy = [e.scheduler.has_unfinished_requests() for e in engines]
            if not any(busy) and not in_flight:
                if all(e.idle.all_arrived for e in engines):
                    return
                waits = []
                for e in engines:
                    waits.append(e.idle.wake_event())
                yield env.any_of(waits)
                continue
            now = env.now
            for e in engines:
                e.ends.expire_due_deadlines(now)
            had_in_flight = bool(in_flight)
            wave, times, tokens, cpu_s, any_work = [], [], [], 0.0, False
            for i, e in enumerate(engines):
                so = None
                if busy[i]:
                    so = e.scheduler.schedule(now_s=now)
                    rec, row = e.record_schedule(so, now)
                    mro, t = e.executor.execute(so)
                    wave.append((e, so, mro, rec, row))
                if so is not None and so.total_num_scheduled_tokens:
                    any_work = True
                    times.append(t)
                    tokens.append(so.total_num_scheduled_tokens)
                    cpu_s = max(cpu_s, e.cpu.step_s(len(so.num_scheduled_tokens),
                                                    so.total_num_scheduled_tokens))
                else:  # nothing scheduled here: a dummy forward joins the others' collectives
                    times.append(self._dummy_s[i])
                    tokens.append(DUMMY_TOKENS)
                    self.num_dummy_steps += 1
            if not any_work:
                gpu_s = 0.0  # no rank computes: no forward pass at all
                self.num_dummy_steps -= len(engines)
            else:
                gpu_s = self._wave_gpu_s(times, tokens)
                self.num_waves += 1
            start = max(now + cpu_s, gpu_free_at)
            gpu_free_at = start + gpu_s
            for e, *_, row in wave:
                e.metrics.steps.set_gpu_time(row, gpu_s)
            in_flight.append((wave, gpu_free_at))
            while in_flight and (len(in_flight) >= depth or not any_work):
                wave0, end0 = in_flight.popleft()
                if end0 > env.now:
                    yield env.timeout(end0 - env.now)
                for e, so, mro, rec, row in wave0:
                    e.apply_output(so, mro, rec, row)
            if not any_work and not had_in_flight and any(e.scheduler.has_unfinished_requests() for e in engines):
                yield env.any_of([e.idle.idle_event() for e in engines])

    def _wave_gpu_s(self, times: list[float], tokens: list[int]) -> float:
        """The slowest rank's step, every rank's MoE layers holding the wave's tokens."""
        total = wave_tokens(self._graph_sizes, tokens)
        return max(t if fix is None else t + fix(n, total)
                   for t, n, fix in zip(times, tokens, self._wave_fix))


def wave_tokens(graph_sizes: tuple[int, ...], tokens: list[int]) -> int:
    """Tokens a lockstep wave's MoE layers hold, over all ranks (``tokens``: each rank's own, a
    dummy's 1). vLLM 0.19.1 (v1/worker/dp_utils.py ``_synchronize_dp_ranks``): the ranks agree on
    a CUDA-graph mode by taking the minimum, and unless it is NONE every rank is padded to the
    largest rank's graph-padded token count; a rank whose batch exceeds the largest capture size
    runs without a graph (NONE), and then each rank keeps its own count. ``graph_sizes``: vLLM's
    default capture sizes for the engine's limits (cost_model/cudagraph.py)."""
    if graph_sizes and max(tokens) <= graph_sizes[-1]:
        return len(tokens) * padded_tokens(graph_sizes, max(tokens))
    return sum(tokens)


DUMMY_TOKENS = 1  # vLLM's dummy batch on an idle DP rank: one token


def dummy_shape() -> StepShape:
    """vLLM's dummy batch on an idle DP rank: one token, nothing sampled."""
    return StepShape((DUMMY_TOKENS,), (0,), 0)
