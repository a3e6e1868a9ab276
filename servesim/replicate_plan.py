"""`servesim plan --replicates N --probability P`: each candidate deployment over N replicates.

A candidate meets the SLO when at least P of its replicates reach the goodput threshold
(search.goodput_threshold): the plan's answer is the cheapest deployment that meets the SLO with
probability P over what the replicates vary (routing ties, the cost model's measured error;
servesim/replicates.py), not on one draw. The plan's trace is fixed: arrival noise is not covered.

Extra columns in plan.csv: probability (fraction of replicates meeting), probability_low/high (its
90 % Wilson interval, servesim/intervals.py), goodput_min/max over the replicates; goodput_fraction,
ttft_p90_s and tpot_p90_s are the means over the replicates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from servesim.intervals import probability_meeting


@dataclass(slots=True)
class PlanReplicateJob:
    """One replicate of one candidate: run the cluster, return its plan figures."""

    cfg: Any  # ClusterConfig
    workload: Any

    def __call__(self) -> dict:
        from servesim.simulator.cluster.cluster import run_cluster
        from servesim.simulator.cluster.plan import goodput_fraction

        res = run_cluster(self.cfg, self.workload)
        s, frac = res.summary, goodput_fraction(res.metrics.columns().requests, self.cfg.slo)
        return {"goodput_fraction": frac, "ttft_p90_s": s["ttft_s"]["p90"],
                "tpot_p90_s": s["tpot_s"]["p90"], "num_finished": s["num_finished"], "num_rejected": s["num_rejected"]}


def evaluate_replicated(plan, shape, size: int, workload, *, perturb: bool = True, workers: int | None = None) -> dict:
    """plan.search's evaluate over plan.search.replicates replicates of the candidate."""
    from servesim.replicates import cluster_perturbation, cluster_replicate, plan_replicates, run_jobs
    from servesim.simulator.cluster.plan import candidate_config, candidate_row

    cfg = candidate_config(plan, shape, size)
    t0 = time.perf_counter()
    search = plan.search
    reps = plan_replicates(cfg.seed, search.replicates, cluster_perturbation(cfg) if perturb else None)
    outs = run_jobs([PlanReplicateJob(cluster_replicate(cfg, r), workload) for r in reps], workers)
    fracs = [o["goodput_fraction"] for o in outs]
    p, lo, hi = probability_meeting([f >= search.goodput_threshold for f in fracs])
    return {**candidate_row(plan, shape, size, cfg), "goodput_fraction": _mean(fracs),
            "meets_slo": p >= search.probability, "probability": p, "probability_low": lo, "probability_high": hi,
            "goodput_min": min(fracs), "goodput_max": max(fracs),
            "ttft_p90_s": _mean([o["ttft_p90_s"] for o in outs]), "tpot_p90_s": _mean([o["tpot_p90_s"] for o in outs]),
            "num_finished": _mean([o["num_finished"] for o in outs]),
            "num_rejected": _mean([o["num_rejected"] for o in outs]),
            "wall_s": time.perf_counter() - t0, "error": None}


def _mean(values: list) -> float | None:
    return None if any(v is None for v in values) else sum(values) / len(values)


def plan_evaluator(plan, *, perturb: bool = True, workers: int | None = None):
    """plan.py's evaluate (one run a candidate) or, with search.replicates > 1, the replicated one."""
    if plan.search.replicates == 1:
        from servesim.simulator.cluster.plan import evaluate

        return evaluate
    return partial(evaluate_replicated, perturb=perturb, workers=workers)
