"""The replicates' folder and summary: what varies, the mean summary, the intervals, the table.

servesim/replicates.py plans and runs the replicates; this module writes their folder (layout there)
and turns their summaries into one: every numeric figure as the mean over the replicates, and a
`replicates` section with per metric the interval of servesim/intervals.py.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from servesim.intervals import CI_LEVEL, PI_LEVEL, interval

REPLICATES_DIR = "replicates"  # OUT/replicates/r00 ...: each replicate's own result folder
LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queueing_s")
# Figures with an interval, besides every statistic of the latency blocks above.
OTHER_KEYS = ("throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
              "goodput.requests_per_s", "goodput.fraction_meeting_slo", "num_finished", "num_rejected",
              "num_preemptions", "prefix_cache_hit_rate", "kv_usage_mean", "sim_duration_s")
WALL_CLOCK_KEYS = ("wall_time_s", "sim_speedup_x")
INTERVAL_METHOD = (f"over the replicates, each one i.i.d. draw: mean; {CI_LEVEL:.0%} Student t-interval of the mean "
                   f"(ci_low, ci_high: mean -/+ t * sd / sqrt(n)); {PI_LEVEL:.0%} prediction interval for one more "
                   "run (pi_low, pi_high: mean -/+ t * sd * sqrt(1 + 1/n)); servesim/intervals.py")


MAX_REPLICATES = 1000


def replicate_setting(value: Any, field: str) -> tuple[int, bool]:
    """(number of replicates, perturb the cost model) from a YAML `replicates:` value: N, or
    {num_replicates: N, perturb_cost_model: BOOL} (how a replicates folder's config.yaml writes it)."""
    from servesim.traces.errors import InputError

    allowed = f"an integer from 1 to {MAX_REPLICATES}, or {{num_replicates: N, perturb_cost_model: true|false}}"
    num, perturb = value, True
    if isinstance(value, dict):
        if not value or set(value) - {"num_replicates", "perturb_cost_model"}:
            raise InputError(f"got keys {sorted(value)}", field=field, allowed=allowed)
        num, perturb = value.get("num_replicates", 1), value.get("perturb_cost_model", True)
    if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= MAX_REPLICATES or not isinstance(perturb, bool):
        raise InputError(f"got {value!r:.80}", field=field, allowed=allowed)
    return num, perturb


def describe_variation(cfg, *, generated: bool, cluster: bool, perturbation) -> dict:
    """What differs between the replicates of a run on SimConfig ``cfg``, and what does not: said in
    the summary rather than implied (a fixed trace gives no arrival noise)."""
    varies, fixed = [], []
    if generated:
        varies.append("arrival times and request lengths: the workload generator is reseeded per replicate")
    else:
        fixed.append("arrival times and prompt/output lengths: the trace's own, identical in every replicate "
                     "(the intervals do not cover arrival noise)")
    if cfg.scheduler.num_spec_tokens and cfg.spec_decode.acceptance:
        varies.append("speculative-decoding acceptance draws")
    if cfg.structured_output.rate > 0:
        varies.append("which requests wait for a grammar compile (structured_output.rate)")
    if cluster:
        varies.append("routing ties: the draws of the routers' shared generator (routers that draw)")
    if perturbation is not None:
        sig = ", ".join(f"{k} {v:.3f}" for k, v in perturbation.sigmas.items())
        varies.append(f"cost-model error: one step-time factor per step kind per replicate, log-normal with sigma "
                      f"{sig} ({perturbation.source})")
    else:
        fixed.append("the cost model (no perturbation)")
    out = {"varies": varies, "fixed": fixed}
    if not varies:
        out["warning"] = "nothing random differs between the replicates: they are identical and every interval is 0 wide"
    return out


def flatten(tree: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves (not bool) of a summary as dotted keys; lists are left out. (Not
    scenario/table.py's flatten: that module imports this one.)"""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def _mean_tree(trees: list[Any]) -> Any:
    """The first tree with every numeric leaf replaced by its mean over all the trees (None where a
    replicate has none or a non-finite value); other leaves (strings, lists) are the first's."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: _mean_tree([t.get(k) if isinstance(t, dict) else None for t in trees]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        values = [t for t in trees if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)]
        return math.fsum(values) / len(values) if len(values) == len(trees) else None
    return first


def interval_keys(summary: dict) -> list[str]:
    flat = flatten(summary)
    keys = [k for k in flat if k.split(".")[0] in LATENCY_KEYS and not k.endswith(".count")]
    return keys + [k for k in OTHER_KEYS if k in flat]


def combine(summaries: list[dict], reps, variation: dict) -> dict:
    """summary.json of a replicates folder."""
    flats = [flatten(s) for s in summaries]
    metrics = {}
    for key in interval_keys(summaries[0]):
        values = [f.get(key) for f in flats]
        if all(v is not None and math.isfinite(v) for v in values):
            metrics[key] = interval([float(v) for v in values]).as_dict()
    out = _mean_tree(summaries)
    for key in WALL_CLOCK_KEYS:  # how long each simulation took: no figure of the serving system
        out.pop(key, None)
    out["replicates"] = {
        "num_replicates": len(summaries), "base_seed": reps[0].seed, "seeds": [r.seed for r in reps],
        "cost_model_factors": [r.factors for r in reps], **variation, "interval_method": INTERVAL_METHOD,
        "ci_level": CI_LEVEL, "pi_level": PI_LEVEL, "metrics": metrics}
    return out


def replicates_csv(summaries: list[dict], reps) -> str:
    buf = io.StringIO()
    keys = interval_keys(summaries[0])
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["replicate", "seed", "factor_prefill", "factor_decode", "factor_mixed", *keys])
    for r, s in zip(reps, summaries):
        f = flatten(s)
        fac = [r.factors[k] for k in ("prefill", "decode", "mixed")] if r.factors else ["", "", ""]
        writer.writerow([r.name, r.seed, *fac, *(f.get(k, "") for k in keys)])
    return buf.getvalue()


def is_replicates(folder: str | Path) -> bool:
    from servesim.simulator.outdir import result_kind

    return result_kind(Path(folder)) == "replicates"


def replicate_values(folder: str | Path, key: str) -> list[float] | None:
    """One metric's value in each replicate of a replicates folder (or a sweep variant run with
    replicates), from its replicates.csv; None when the file or the metric is missing."""
    path = Path(folder) / "replicates.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        values = [float(r[key]) for r in rows]
    except (KeyError, ValueError):
        return None
    return values or None


# --- the console ----------------------------------------------------------------------------------

ROWS = (("ttft_s", "TTFT", 1e3, "ms"), ("tpot_s", "TPOT", 1e3, "ms"), ("itl_s", "ITL", 1e3, "ms"),
        ("e2e_s", "E2E", 1.0, "s"), ("queueing_s", "queueing", 1e3, "ms"))


def print_replicates(console, summary: dict, out: Path | None = None) -> None:
    """The intervals table: every latency statistic, then throughput and goodput."""
    from rich.table import Table

    rep = summary["replicates"]
    n, m = rep["num_replicates"], rep["metrics"]
    t = Table(title=f"servesim replicates: {n} runs (mean, {rep['ci_level']:.0%} CI of the mean, "
                    f"{rep['pi_level']:.0%} prediction interval)")
    for col in ("metric", "mean", "CI of mean", "prediction interval"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for key, label, scale, unit in ROWS:
        for stat in ("mean", "p50", "p90", "p95", "p99"):
            iv = m.get(f"{key}.{stat}")
            if iv is not None:
                t.add_row(f"{label} {stat} ({unit})", *_cells(iv, scale))
    for key, label, scale in (("throughput.output_tokens_per_s", "output tok/s", 1.0),
                              ("throughput.requests_per_s", "req/s", 1.0),
                              ("goodput.fraction_meeting_slo", "meeting SLO (%)", 100.0),
                              ("num_preemptions", "preemptions", 1.0)):
        if key in m:
            t.add_row(label, *_cells(m[key], scale))
    console.print(t)
    for line in rep["varies"]:
        console.print(f"varies: {line}", highlight=False)
    for line in rep["fixed"]:
        console.print(f"fixed: {line}", highlight=False)
    if "warning" in rep:
        console.print(f"[yellow]warning:[/] {rep['warning']}", highlight=False)
    if out is not None:
        console.print(f"results in {out}/ (each replicate in {out}/replicates/)")


def _cells(iv: dict, scale: float) -> list[str]:
    def f(x: float) -> str:
        x *= scale
        return f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.3g}"

    return [f(iv["mean"]), f"[{f(iv['ci_low'])}, {f(iv['ci_high'])}]", f"[{f(iv['pi_low'])}, {f(iv['pi_high'])}]"]
