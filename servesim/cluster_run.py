"""The cores of `servesim cluster` and `servesim plan`, shared by the commands and servesim.api, so
both read the same files with the same validation.

    res, wl = run_cluster_file("cluster.yaml", out_dir="runs/cluster")
    table = run_plan_file("plan.yaml", out_dir="runs/plan")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from servesim.traces.errors import InputError


def _path(value, field: str) -> Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise InputError(f"got {value!r}", field=field, allowed="a file path (str or pathlib.Path)")
    return Path(value).expanduser()


def _check_limits(max_requests, rate_scale) -> None:
    if max_requests is not None and (isinstance(max_requests, bool) or not isinstance(max_requests, int)
                                     or max_requests < 1):
        raise InputError(f"got {max_requests!r}", field="--max-requests", allowed="an integer >= 1")
    if rate_scale is not None and (isinstance(rate_scale, bool) or not isinstance(rate_scale, (int, float))
                                   or not rate_scale > 0):
        raise InputError(f"got {rate_scale!r}", field="--rate-scale", allowed="a number > 0")


def load_cluster_yaml(path: Path) -> tuple[dict, dict]:
    """(cluster config dict, workload section) from a YAML file; `workload:` is optional."""
    from servesim.simulator.yaml_input import read_text_bounded, safe_load_bounded

    text = read_text_bounded(path, "cluster config")
    data = safe_load_bounded(text, str(path))
    if not isinstance(data, dict):
        raise InputError("a cluster config must be a mapping", path=str(path))
    workload = data.pop("workload", None) or {}
    if not isinstance(workload, dict):
        raise InputError("workload must be a mapping", path=str(path), field="workload",
                         allowed="{trace, format, rate_scale, max_requests}, or a generator: section")
    return data, workload


def load_cluster_workload(spec: dict, trace: str | None = None, base_dir: Path | None = None,
                          smoke: bool = False):
    """A cluster file's workload: a trace (simulator/cluster/plan.py load_plan_workload) or, with
    `generator:` and no TRACE argument, a synthetic workload written as a scenario's `workload:`
    section (servesim/scenario/workload.py). `smoke`: cut to a few requests (CI, quick looks;
    generators are cut inside, so sessions end on a last turn)."""
    from servesim.scenario.source import Marks
    from servesim.scenario.workload import SMOKE_MAX_REQUESTS, build_workload, parse_workload
    from servesim.simulator.cluster.plan import load_plan_workload

    if "daily_shape" in spec:  # a day's rate profile on the arrivals (simulator/cluster/autoscale/diurnal.py)
        from servesim.simulator.cluster.autoscale.diurnal import apply_daily_shape, daily_shape_from_dict

        spec = dict(spec)
        shape = daily_shape_from_dict(spec.pop("daily_shape"))
        return apply_daily_shape(load_cluster_workload(spec, trace, base_dir, smoke), shape)
    if ("generator" in spec or "bench" in spec) and trace is None:  # generated here (scenario/workload.py)
        parsed = parse_workload(spec, 0, Marks())
        return build_workload(parsed.smoke() if smoke else parsed)
    if smoke:
        spec = {**spec, "max_requests": min(spec.get("max_requests") or SMOKE_MAX_REQUESTS, SMOKE_MAX_REQUESTS)}
    return load_plan_workload(spec, trace, base_dir=base_dir)


def _cluster_file(config, fmt: str | None, max_requests: int | None, rate_scale: float | None):
    """(config path, ClusterConfig, workload spec with the flags applied, (replicates, perturb) the
    file's `replicates:` key asks for)."""
    from servesim.replicate_summary import replicate_setting
    from servesim.simulator.cluster import cluster_config_from_dict

    config = _path(config, "config")
    _check_limits(max_requests, rate_scale)
    data, wl_spec = load_cluster_yaml(config)
    setting = replicate_setting(data.pop("replicates", 1), f"replicates ({config})")
    cfg = cluster_config_from_dict(data, str(config))
    for key, value in (("format", fmt), ("max_requests", max_requests), ("rate_scale", rate_scale)):
        if value is not None:
            wl_spec[key] = value
    return config, cfg, wl_spec, setting


def load_cluster_run(config, trace=None, fmt: str | None = None, max_requests: int | None = None,
                     rate_scale: float | None = None, smoke: bool = False):
    """The cluster file's ClusterConfig and its workload (TRACE and the flags override the file's)."""
    config, cfg, wl_spec, _ = _cluster_file(config, fmt, max_requests, rate_scale)
    return cfg, load_cluster_workload(wl_spec, None if trace is None else str(trace), base_dir=config.parent,
                                      smoke=smoke)


def run_cluster_file(config, trace=None, *, fmt: str | None = None, max_requests: int | None = None,
                     rate_scale: float | None = None, out_dir=None, overwrite: bool = False, smoke: bool = False,
                     announce: Callable[[str], None] | None = None, replicates: int | None = None,
                     workers: int | None = None, perturb_cost_model: bool | None = None):
    """Simulate the cluster file (and write the result folder when out_dir is given): (results, workload).
    replicates (default: the file's `replicates:`, else 1) > 1 writes the replicates folder
    (docs/UNCERTAINTY.md; needs out_dir) and returns (None, workload)."""
    from servesim.identity import run_identity
    from servesim.simulator.cluster import run_cluster, write_cluster_results
    from servesim.simulator.outdir import check_output, claim_output

    if out_dir is not None:
        check_output(out_dir, overwrite=overwrite)  # before any work: a refused folder costs nothing
    path, cfg, wl_spec, (in_file, perturb_in_file) = _cluster_file(config, fmt, max_requests, rate_scale)
    trace_s = None if trace is None else str(trace)
    wl = load_cluster_workload(wl_spec, trace_s, base_dir=path.parent, smoke=smoke)
    if announce is not None:
        announce(f"cluster: {cfg.num_replicas} replica(s), {cfg.num_gpus} GPU(s), router {cfg.router.name}"
                 f"{', P/D' if cfg.pd else ''}; {len(wl.requests)} requests")
    meta = {"name": wl.name, "source": str(wl.source), "num_requests": len(wl.requests), "attribution": wl.attribution}
    replicates = in_file if replicates is None else replicates  # the flags win over the file
    if replicates != 1:
        from servesim.commands.replicate_runs import cluster_replicates
        from servesim.replicates import replicate_seed

        if out_dir is None:
            raise InputError("replicates need a result folder", field="out_dir", allowed="a folder path")
        regenerate = (lambda r: load_cluster_workload({**wl_spec, "seed": replicate_seed(wl_spec.get("seed") or 0, r.index)},
                                                      trace_s, path.parent, smoke)) \
            if ("generator" in wl_spec or "bench" in wl_spec) and trace is None \
            else (lambda r: wl)  # a generator is reseeded; a trace is fixed
        cluster_replicates(cfg, regenerate, meta, replicates, Path(out_dir), overwrite=overwrite, workers=workers,
                           perturb=perturb_in_file if perturb_cost_model is None else perturb_cost_model)
        return None, wl
    if out_dir is None:
        return run_cluster(cfg, wl), wl
    with claim_output(out_dir, overwrite=overwrite) as out:  # out: ~ expanded
        res = run_cluster(cfg, wl)
        inputs = [str(config)] + ([str(trace)] if trace is not None else [])
        write_cluster_results(out, res, meta, overwrite=overwrite, identity=run_identity(cfg.seed, inputs))
    return res, wl


def load_plan_run(config, trace=None, max_requests: int | None = None, rate_scale: float | None = None,
                  replicates: int | None = None, probability: float | None = None):
    """The plan file's PlanConfig and its workload (TRACE and the flags override the file's; so do
    replicates and probability its search.replicates / search.probability, checked the same way)."""
    from servesim.simulator.cluster.plan import PlanConfig, load_plan_workload, plan_config_from_dict

    config = _path(config, "config")
    _check_limits(max_requests, rate_scale)
    plan = PlanConfig.from_yaml(config)
    if replicates is not None or probability is not None:
        from servesim.simulator.yaml_input import safe_load_bounded

        data = safe_load_bounded(config.read_text(), str(config))  # the same checks as the file's own keys
        space = {**(data.get("search") or {}), **({"replicates": replicates} if replicates is not None else {}),
                 **({"probability": probability} if probability is not None else {})}
        plan = plan_config_from_dict({**data, "search": space}, str(config))
    spec = dict(plan.workload)
    if max_requests is not None:
        spec["max_requests"] = max_requests
    if rate_scale is not None:
        spec["rate_scale"] = rate_scale
    return plan, load_plan_workload(spec, None if trace is None else str(trace), base_dir=config.parent)


def run_plan_file(config, trace=None, *, max_requests: int | None = None, rate_scale: float | None = None,
                  out_dir=None, overwrite: bool = False, progress: Callable[[dict], None] | None = None,
                  announce: Callable[[str], None] | None = None, replicates: int | None = None,
                  probability: float | None = None, workers: int | None = None, perturb_cost_model: bool = True):
    """Search the plan file's deployments: the plan table (a DataFrame); with out_dir, plan.csv and
    frontier.png there. A plan with an `autoscale:` section also searches autoscaled fleets
    (simulator/cluster/plan_autoscale.py): their table is the result's attrs["autoscaled"] (and
    plan_autoscaled.csv); `announce` hears each autoscaled candidate's line."""
    from servesim.plots.plan import plot_frontier
    from servesim.simulator.cluster.plan import search
    from servesim.simulator.cluster.plan_autoscale import autoscale_search, search_autoscaled
    from servesim.simulator.outdir import check_output, staged_output

    if out_dir is not None:
        check_output(out_dir, overwrite=overwrite)
    from servesim.replicate_plan import plan_evaluator

    plan, wl = load_plan_run(config, trace, max_requests, rate_scale, replicates, probability)
    auto_search = autoscale_search(plan, str(config))  # checked before any run
    reps = plan.search.replicates
    if announce is not None:
        announce(f"plan: {len(plan.search.shapes())} shape(s), {len(wl.requests)} requests, goodput threshold "
                 f"{plan.search.goodput_threshold:.0%}" + (f"; {reps} replicates per candidate, meeting the SLO in "
                                                           f"at least {plan.search.probability:.0%} of them"
                                                           if reps > 1 else ""))
    evaluator = plan_evaluator(plan, perturb=perturb_cost_model, workers=workers)

    def autoscaled():
        return search_autoscaled(plan, auto_search, wl, lambda r: announce and announce(
            f"  autoscaled {r['shape']} min {r['min_replicas']} {r['param']}={r['value']}: "
            + (f"skipped ({r['error']})" if r['error'] else
               f"goodput {r['goodput_fraction']:.1%}, ${r['usd_per_day']:,.0f}/day ({r['wall_s']:.1f} s)")))

    if out_dir is None:
        df = search(plan, wl, progress, evaluator)
        if auto_search is not None:
            df.attrs["autoscaled"] = autoscaled()
        return df
    with staged_output(out_dir, "plan", overwrite=overwrite) as tmp:
        df = search(plan, wl, progress, evaluator)
        df.to_csv(tmp / "plan.csv", index=False)
        plot_frontier(df, plan.search.goodput_threshold, tmp / "frontier.png", cost_label(plan))
        if auto_search is not None:
            df.attrs["autoscaled"] = auto = autoscaled()
            auto.to_csv(tmp / "plan_autoscaled.csv", index=False)
    return df


def cost_label(plan) -> str:
    """Costs are dollars: the shipped price table (simulator/specs/gpu_prices.yaml) under the plan's own."""
    return "cost ($/h)"
