"""Replicates: one run repeated over N independent seeds (and cost-model draws), with intervals.

    servesim replay TRACE --replicates 8 [--workers 4] [--no-perturb-cost-model]
    servesim cluster CONFIG.yaml --replicates 8
    servesim plan PLAN.yaml --replicates 8 --probability 0.9

One seeded generator per run stays the rule. Replicate k runs with its own seed, derived from the
base seed by numpy's SeedSequence (entropy = base seed, spawn_key = (k,)): replicate 0 keeps the
base seed itself (the plain run's seed), replicate k >= 1 the first 32-bit word of its child's state.
Each replicate's seed is written into its run.json and config.yaml, so any replicate reruns alone,
byte for byte. With cost-model perturbation on (the default), replicate k also runs the `perturbed`
cost model with one factor per kind of step drawn from the base model's measured error
(simulator/cost_model/perturbed.py) by a generator of its own (spawn_key (k, 0)); the factors go
into its config.yaml.

`--replicates 1` is no replicate machinery at all: the plain run, the same files byte for byte.

    OUT/                      marker "replicates"
      summary.json            every numeric figure as the mean over the replicates, plus a
                              `replicates` section: seeds, what varies, and per metric the mean,
                              sd, 95 % CI of the mean and 90 % prediction interval (intervals.py)
      config.yaml             replicate 0's settings with the base seed and cost model, and replicates: N
      replicates.csv          one row per replicate: seed, cost-model factors, every interval metric
      replicates/r00 ... rNN  each replicate's own result folder (a replay or cluster result)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servesim.replicate_summary import MAX_REPLICATES, REPLICATES_DIR, describe_variation
from servesim.traces.errors import InputError


def check_replicates(n: Any, flag: str = "--replicates") -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPLICATES:
        raise InputError(f"got {n!r}", field=flag, allowed=f"an integer from 1 to {MAX_REPLICATES}")
    return n


def replicate_seed(base_seed: int, k: int) -> int:
    """The seed of replicate k (0: the base seed itself)."""
    if k == 0:
        return base_seed
    return int(np.random.SeedSequence(_entropy(base_seed), spawn_key=(k,)).generate_state(1, np.uint32)[0])


def factor_rng(base_seed: int, k: int) -> np.random.Generator:
    """Replicate k's generator of cost-model factors: independent of every run's own generator."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(base_seed), spawn_key=(k, 0)))


def _entropy(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"got {seed!r}", field="seed", allowed="an integer >= 0 (replicates derive theirs from it)")
    return seed


@dataclass(slots=True)
class Perturbation:
    """The cost-model error replicates draw from: sigma of the log step time per step kind."""

    sigmas: dict[str, float]
    source: str


def cost_model_perturbation(cfg) -> Perturbation:
    from servesim.simulator.cost_model.perturbed import residual_sigmas

    sigmas, source = residual_sigmas(cfg)
    return Perturbation(sigmas, source)


def perturbed_config(cfg, seed: int, factors: dict[str, float] | None):
    """A copy of SimConfig ``cfg`` with ``seed``, its cost model wrapped in `perturbed` when factors."""
    from servesim.simulator.config import CostModelConfig

    out = copy.deepcopy(cfg)
    out.seed = seed
    if factors is not None:
        cm = cfg.cost_model
        out.cost_model = CostModelConfig(name="perturbed", params={
            **copy.deepcopy(cm.params), "base": cm.name, "factors": dict(factors)},
            cpu_overhead=copy.deepcopy(cm.cpu_overhead))
    return out


@dataclass(slots=True)
class Replicate:
    """One replicate's settings: its index, seed and cost-model factors (None: unperturbed)."""

    index: int
    seed: int
    factors: dict[str, float] | None

    @property
    def name(self) -> str:
        return f"r{self.index:02d}"


def plan_replicates(base_seed: int, n: int, perturbation: Perturbation | None) -> list[Replicate]:
    from servesim.simulator.cost_model.perturbed import draw_factors

    return [Replicate(k, replicate_seed(base_seed, k),
                      None if perturbation is None else draw_factors(perturbation.sigmas, factor_rng(base_seed, k)))
            for k in range(check_replicates(n))]


# --- running them -----------------------------------------------------------------------------------

Job = Callable[[], dict]  # a picklable callable: runs one replicate (writing its folder), returns its summary


def run_jobs(jobs: list[Job], workers: int | None, done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Run the replicates' jobs, each its own run: in this process with one worker, else on a
    spawn process pool (the sweep's local backend's rules: workers die with the driver, Ctrl-C
    stops them). Returns the summaries in replicate order; ``done(index, summary)`` as each ends."""
    from servesim.scenario.backends import _stop_workers, default_workers, die_with_parent

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InputError(f"got {workers!r}", field="--workers", allowed="an integer >= 1 (default: the CPU cores)")
    workers = min(workers or default_workers(len(jobs)), len(jobs))
    out: dict[int, dict] = {}
    if workers == 1:
        for i, job in enumerate(jobs):
            out[i] = job()
            if done is not None:
                done(i, out[i])
        return [out[i] for i in range(len(jobs))]
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(job): i for i, job in enumerate(jobs)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in finished:
                out[futures[fut]] = fut.result()
                if done is not None:
                    done(futures[fut], out[futures[fut]])
    except BaseException:
        _stop_workers(pool)
        raise
    pool.shutdown(wait=True)
    return [out[i] for i in range(len(jobs))]


@dataclass(slots=True)
class ReplayJob:
    """One replay replicate: simulate ``workload`` under ``cfg`` and write ``out_dir``."""

    cfg: Any
    workload: Any
    out_dir: str

    def __call__(self) -> dict:
        from servesim.running import run

        return run(self.cfg, self.workload, out_dir=self.out_dir).summary


def run_replay_replicates(cfg, workload_for: Callable[[Replicate], Any], n: int, out_dir: str | Path, *,
                          perturb: bool = True, workers: int | None = None, overwrite: bool = False,
                          done: Callable[[int, dict], None] | None = None) -> dict:
    """N replicates of a replay into out_dir (layout in the module docstring); returns the
    replicate summary (summary.json). ``workload_for(replicate)`` gives a replicate's workload: the
    same trace every time (the same object: nothing to say about arrival noise), or a generated one
    reseeded."""
    perturbation = cost_model_perturbation(cfg) if perturb else None
    reps = plan_replicates(cfg.seed, n, perturbation)
    workloads = [workload_for(r) for r in reps]
    generated = any(w is not workloads[0] for w in workloads[1:])
    variation = describe_variation(cfg, generated=generated, cluster=False, perturbation=perturbation)

    def jobs(root: Path) -> list[Job]:
        return [ReplayJob(perturbed_config(cfg, r.seed, r.factors), w, str(root / r.name))
                for r, w in zip(reps, workloads)]

    def base(root: Path) -> dict:
        """Replicate 0's config.yaml as written (the KV pool resolved, the workload section) with the
        base seed and the unperturbed cost model."""
        import yaml

        from servesim.simulator.config import to_dict

        first = yaml.safe_load((root / reps[0].name / "config.yaml").read_text())
        return {**first, "seed": cfg.seed, "cost_model": to_dict(cfg.cost_model)}

    return write_replicate_folder(out_dir, reps, jobs, variation, base, workers=workers, overwrite=overwrite, done=done)


@dataclass(slots=True)
class ClusterJob:
    """One cluster replicate: run ``cfg`` (a ClusterConfig) on ``workload`` and write ``out_dir``."""

    cfg: Any
    workload: Any
    meta: dict
    out_dir: str

    def __call__(self) -> dict:
        from servesim.identity import run_identity
        from servesim.simulator.cluster import run_cluster, write_cluster_results

        res = run_cluster(self.cfg, self.workload)
        write_cluster_results(self.out_dir, res, self.meta, overwrite=False, identity=run_identity(self.cfg.seed, []))
        return res.summary


def cluster_replicate(cfg, rep: Replicate):
    """A ClusterConfig for replicate ``rep``: the routers' seed and every replica's engine seed
    derived from rep.seed (replica i: replicate_seed(rep.seed, i + 1)), each replica's cost model
    perturbed by rep.factors (one machine type's error is shared by its replicas)."""
    groups, i = [], 0
    for g in cfg.replicas:
        sim = perturbed_config(g.sim, replicate_seed(rep.seed, i + 1) if rep.index else g.sim.seed, rep.factors)
        groups.append(dataclasses.replace(g, sim=sim))
        i += g.count
    return dataclasses.replace(cfg, replicas=groups, seed=rep.seed)


def cluster_perturbation(cfg) -> Perturbation:
    """The perturbation of a cluster's replicas: the first group's model error (groups on other
    models or GPUs draw the same factors: documented in docs/UNCERTAINTY.md)."""
    return cost_model_perturbation(cfg.replicas[0].sim)


def run_cluster_replicates(cfg, workload_for: Callable[[Replicate], Any], meta: dict, n: int, out_dir: str | Path, *,
                           perturb: bool = True, workers: int | None = None, overwrite: bool = False,
                           done: Callable[[int, dict], None] | None = None) -> dict:
    perturbation = cluster_perturbation(cfg) if perturb else None
    reps = plan_replicates(cfg.seed, n, perturbation)
    workloads = [workload_for(r) for r in reps]
    generated = any(w is not workloads[0] for w in workloads[1:])
    variation = describe_variation(cfg.replicas[0].sim, generated=generated, cluster=True, perturbation=perturbation)

    def jobs(root: Path) -> list[Job]:
        return [ClusterJob(cluster_replicate(cfg, r), w, meta, str(root / r.name)) for r, w in zip(reps, workloads)]

    from servesim.simulator.cluster.config import cluster_config_to_dict

    def base(root: Path) -> dict:
        return {**cluster_config_to_dict(cfg), "workload": meta}

    return write_replicate_folder(out_dir, reps, jobs, variation, base, workers=workers, overwrite=overwrite, done=done)


# --- the folder ---------------------------------------------------------------------------------------

def write_replicate_folder(out_dir: str | Path, reps, jobs_for: Callable[[Path], list], variation: dict,
                           base_config: Callable[[Path], dict], *, workers: int | None, overwrite: bool,
                           done=None) -> dict:
    """Run the jobs into a staging folder's replicates/ and publish it as out_dir (marker
    "replicates") when all are done: a killed run leaves no half folder. config.yaml: the settings
    the replicates share (``base_config(replicates root)``: base seed, unperturbed cost model) with a
    `replicates:` key, so it reruns them all; `compare` reads it like a run's."""
    import yaml

    from servesim.replicate_summary import combine, replicates_csv
    from servesim.simulator.outdir import staged_output

    with staged_output(out_dir, "replicates", overwrite=overwrite) as tmp:
        root = tmp / REPLICATES_DIR
        root.mkdir()
        summaries = run_jobs(jobs_for(root), workers, done)
        summary = combine(summaries, reps, variation)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (tmp / "replicates.csv").write_text(replicates_csv(summaries, reps))
        perturbed = reps[0].factors is not None  # written the way `replicates:` reads back (replicate_setting)
        config = {**base_config(root), "replicates": len(reps) if perturbed else {
            "num_replicates": len(reps), "perturb_cost_model": False}}
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return summary


def variant_replicates(task, n: int, perturb: bool) -> tuple[dict[str, bytes], dict]:
    """A sweep variant (scenario/task.py's VariantTask) over n replicates, in the worker that runs
    the variant (one process: the backend spreads variants): its files (summary.json with the intervals, replicates.csv, config.yaml,
    and replicate 0's requests/steps/timeseries, the base seed's run, so the variant's figures draw)
    and the summary. A generator workload is reseeded per replicate from its own seed."""
    import dataclasses
    import tempfile

    from servesim.scenario import store
    from servesim.scenario.workload import build_workload

    def workload_for(rep):
        if spec.generator is None:
            return fixed
        return build_workload(dataclasses.replace(spec, seed=replicate_seed(spec.seed, rep.index)))

    cfg, spec = task.cfg, task.workload
    fixed = build_workload(spec) if spec.generator is None else None
    with tempfile.TemporaryDirectory(prefix=store.scratch_prefix()) as tmp:
        summary = run_replay_replicates(cfg, workload_for, n, Path(tmp) / "run", perturb=perturb, workers=1)
        files = store.read_files(Path(tmp) / "run")
        first = store.read_files(Path(tmp) / "run" / REPLICATES_DIR / "r00")
    files.update({k: v for k, v in first.items() if k in ("requests.parquet", "steps.parquet", "timeseries.csv")})
    files[".servesim"] = first[".servesim"]  # a variant folder reads as one run (replicate 0's frames)
    return files, summary


def load_replicates(folder: str | Path):
    """A replicates folder as Results: the replicate summary (means, `replicates` section) and every
    replicate's requests, steps and timeseries stacked, with a `replicate` column (r00, r01, ...)."""
    import pandas as pd

    from servesim.running import Results
    from servesim.scenario.results import load_results

    folder = Path(folder)
    runs = {sub.name: load_results(sub) for sub in sorted((folder / REPLICATES_DIR).iterdir()) if sub.is_dir()}

    def stack(kind: str):
        return pd.concat([getattr(r, kind).assign(replicate=name) for name, r in runs.items()], ignore_index=True)

    summary = json.loads((folder / "summary.json").read_text())
    return Results(summary, stack("requests"), stack("steps"), stack("timeseries"), folder)
