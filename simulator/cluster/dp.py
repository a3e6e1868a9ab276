"""Data-parallel deployments as vLLM runs them for MoE models (``--data-parallel-size N``).

vLLM's data parallelism (docs "Data Parallel Deployment"): N engine cores, each with its own
scheduler and KV cache, share one set of expert-parallel MoE layers. The front end balances
requests over the ranks; every forward pass is a collective across ranks (the MoE all-to-all),
so ranks step together and a rank with nothing to do runs a dummy batch to take part.

servesim models this as N replicas behind the ``vllm_dp`` router, each replica's cost model told
the group's size (``data_parallel_size``: its MoE layers process the tokens of all N ranks, under
the balanced-load assumption the router aims for, plus the dispatch/combine all-to-all; see
docs/COST_MODELS.md). The per-step lockstep (a rank waits for the slowest) is not simulated.
"""

from __future__ import annotations

import dataclasses

from servesim.simulator.cluster.config import ClusterConfig, ReplicaGroup, RouterConfig
from servesim.simulator.cluster.routers import Decision, Router, _least, register_router
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
                      seed: int = 0) -> ClusterConfig:
    """A ``data_parallel_size``-rank deployment of ``sim`` (each rank: its TP group)."""
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
    return ClusterConfig(replicas=[ReplicaGroup(count=data_parallel_size, sim=rank, name="dp")],
                         router=RouterConfig("vllm_dp"), seed=seed)
