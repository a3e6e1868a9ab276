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
    from servesim.simulator.yaml_input import safe_load_bounded

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read cluster config: {e.strerror}", path=str(path)) from None
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
    if "generator" in spec and trace is None:
        parsed = parse_workload(spec, 0, Marks())
        return build_workload(parsed.smoke() if smoke else parsed)
    if smoke:
        spec = {**spec, "max_requests": min(spec.get("max_requests") or SMOKE_MAX_REQUESTS, SMOKE_MAX_REQUESTS)}
    return load_plan_workload(spec, trace, base_dir=base_dir)


def load_cluster_run(config, trace=None, fmt: str | None = None, max_requests: int | None = None,
                     rate_scale: float | None = None, smoke: bool = False):
    """The cluster file's ClusterConfig and its workload (TRACE and the flags override the file's)."""
    from servesim.simulator.cluster import cluster_config_from_dict

    config = _path(config, "config")
    _check_limits(max_requests, rate_scale)
    data, wl_spec = load_cluster_yaml(config)
    cfg = cluster_config_from_dict(data, str(config))
    for key, value in (("format", fmt), ("max_requests", max_requests), ("rate_scale", rate_scale)):
        if value is not None:
            wl_spec[key] = value
    return cfg, load_cluster_workload(wl_spec, None if trace is None else str(trace), base_dir=config.parent,
                                      smoke=smoke)


def run_cluster_file(config, trace=None, *, fmt: str | None = None, max_requests: int | None = None,
                     rate_scale: float | None = None, out_dir=None, overwrite: bool = False, smoke: bool = False,
                     announce: Callable[[str], None] | None = None):
    """Simulate the cluster file (and write the result folder when out_dir is given): (results, workload)."""
    from servesim.identity import run_identity
    from servesim.simulator.cluster import run_cluster, write_cluster_results
    from servesim.simulator.outdir import check_output, claim_output

    if out_dir is not None:
        check_output(out_dir, overwrite=overwrite)  # before any work: a refused folder costs nothing
    cfg, wl = load_cluster_run(config, trace, fmt, max_requests, rate_scale, smoke)
    if announce is not None:
        announce(f"cluster: {cfg.num_replicas} replica(s), {cfg.num_gpus} GPU(s), router {cfg.router.name}"
                 f"{', P/D' if cfg.pd else ''}; {len(wl.requests)} requests")
    if out_dir is None:
        return run_cluster(cfg, wl), wl
    with claim_output(out_dir, overwrite=overwrite) as out:  # out: ~ expanded
        res = run_cluster(cfg, wl)
        meta = {"name": wl.name, "source": str(wl.source), "num_requests": len(wl.requests),
                "attribution": wl.attribution}
        inputs = [str(config)] + ([str(trace)] if trace is not None else [])
        write_cluster_results(out, res, meta, overwrite=overwrite, identity=run_identity(cfg.seed, inputs))
    return res, wl


def load_plan_run(config, trace=None, max_requests: int | None = None, rate_scale: float | None = None):
    """The plan file's PlanConfig and its workload (TRACE and the flags override the file's)."""
    from servesim.simulator.cluster.plan import PlanConfig, load_plan_workload

    config = _path(config, "config")
    _check_limits(max_requests, rate_scale)
    plan = PlanConfig.from_yaml(config)
    spec = dict(plan.workload)
    if max_requests is not None:
        spec["max_requests"] = max_requests
    if rate_scale is not None:
        spec["rate_scale"] = rate_scale
    return plan, load_plan_workload(spec, None if trace is None else str(trace), base_dir=config.parent)


def run_plan_file(config, trace=None, *, max_requests: int | None = None, rate_scale: float | None = None,
                  out_dir=None, overwrite: bool = False, progress: Callable[[dict], None] | None = None,
                  announce: Callable[[str], None] | None = None):
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
    plan, wl = load_plan_run(config, trace, max_requests, rate_scale)
    auto_search = autoscale_search(plan, str(config))  # checked before any run
    if announce is not None:
        announce(f"plan: {len(plan.search.shapes())} shape(s), {len(wl.requests)} requests, goodput threshold "
                 f"{plan.search.goodput_threshold:.0%}")

    def autoscaled():
        return search_autoscaled(plan, auto_search, wl, lambda r: announce and announce(
            f"  autoscaled {r['shape']} min {r['min_replicas']} {r['param']}={r['value']}: "
            + (f"skipped ({r['error']})" if r['error'] else
               f"goodput {r['goodput_fraction']:.1%}, ${r['usd_per_day']:,.0f}/day ({r['wall_s']:.1f} s)")))

    if out_dir is None:
        df = search(plan, wl, progress)
        if auto_search is not None:
            df.attrs["autoscaled"] = autoscaled()
        return df
    with staged_output(out_dir, "plan", overwrite=overwrite) as tmp:
        df = search(plan, wl, progress)
        df.to_csv(tmp / "plan.csv", index=False)
        plot_frontier(df, plan.search.goodput_threshold, tmp / "frontier.png", cost_label(plan))
        if auto_search is not None:
            df.attrs["autoscaled"] = auto = autoscaled()
            auto.to_csv(tmp / "plan_autoscaled.csv", index=False)
    return df


def cost_label(plan) -> str:
    """Costs are dollars: the shipped price table (simulator/specs/gpu_prices.yaml) under the plan's own."""
    return "cost ($/h)"
