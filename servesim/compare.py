"""Runs side by side: `servesim compare RUN_A RUN_B ...` (and servesim.api.compare).

Two tables: the settings that differ between the runs (their config.yaml, flattened to dotted
keys), and the headline metrics of each run with its change against the first (the baseline).
With an output folder, a report.html (both tables and the runs' latency CDFs overlaid), written
as a result folder of its own (simulator/outdir.py's rule).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servesim.traces.errors import InputError

# (summary key, label, scale, unit, decimals); dotted keys reach into nested sections.
METRICS = (("ttft_s.p50", "TTFT p50", 1e3, "ms", 1), ("ttft_s.p99", "TTFT p99", 1e3, "ms", 1),
           ("tpot_s.p50", "TPOT p50", 1e3, "ms", 2), ("tpot_s.p99", "TPOT p99", 1e3, "ms", 2),
           ("itl_s.p50", "ITL p50", 1e3, "ms", 2), ("e2e_s.p50", "E2E p50", 1.0, "s", 2),
           ("e2e_s.p99", "E2E p99", 1.0, "s", 2),
           ("throughput.output_tokens_per_s", "output throughput", 1.0, "tok/s", 0),
           ("goodput.fraction_meeting_slo", "meeting SLO", 100.0, "%", 1),
           ("num_preemptions", "preemptions", 1.0, "", 0), ("prefix_cache_hit_rate", "prefix-cache hit rate", 100.0, "%", 1),
           ("kv_usage_mean", "KV usage mean", 100.0, "%", 1), ("num_rejected", "rejected", 1.0, "", 0))


@dataclass(slots=True)
class Comparison:
    """names: each run's label (its folder name); settings: dotted key -> value per run, only the
    keys whose values differ; metrics: (label, unit, decimals, value per run, scaled)."""

    folders: list[Path]
    names: list[str]
    summaries: list[dict]
    settings: dict[str, list]
    metrics: list[tuple[str, str, int, list[float | None]]]
    # Per metric row, per run after the first: whether it differs from the baseline beyond noise
    # ("beyond noise" / "within noise"), or None when either is a single run (replicate_summary.py).
    noise: list[list[str | None]] = field(default_factory=list)


def compare_runs(folders: list[str | Path]) -> Comparison:
    """Read each run folder (a replay or cluster result, or a sweep's variant folder)."""
    if len(folders) < 2:
        raise InputError(f"got {len(folders)} run folder(s)", field="RUNS", allowed="two or more run folders")
    paths = [Path(f).expanduser() for f in folders]
    summaries, configs = [], []
    for p in paths:
        if not (p / "summary.json").is_file():
            raise InputError("not a run folder: it has no summary.json", path=str(p),
                             allowed="the --out folder of `servesim replay` or `cluster`, or a sweep's variants/NAME")
        try:
            summaries.append(json.loads((p / "summary.json").read_text()))
            configs.append(yaml.safe_load((p / "config.yaml").read_text()) if (p / "config.yaml").is_file() else {})
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise InputError(f"cannot read the run: {exc}", path=str(p)) from None
    names = _names(paths)
    flat = [_flatten(c or {}) for c in configs]
    keys = sorted(set().union(*flat))
    settings = {k: [f.get(k) for f in flat] for k in keys if len({json.dumps(f.get(k), default=str) for f in flat}) > 1}
    metrics, noise = [], []
    for key, label, scale, unit, digits in METRICS:
        values = [_get(s, key) for s in summaries]
        if any(v is not None for v in values):
            metrics.append((label, unit, digits, [None if v is None else v * scale for v in values]))
            noise.append(noise_verdicts(paths, key))
    return Comparison(paths, names, summaries, settings, metrics, noise)


def noise_verdicts(paths: list[Path], key: str) -> list[str | None]:
    """Each run after the first against the first on metric ``key``: Welch's test over their
    replicates (servesim/intervals.py), None where either is a single run."""
    from servesim.intervals import differ
    from servesim.replicate_summary import replicate_values

    base = replicate_values(paths[0], key)
    out: list[str | None] = []
    for p in paths[1:]:
        other = replicate_values(p, key)
        if base is None or other is None or len(base) < 2 or len(other) < 2:
            out.append(None)
        else:
            out.append("beyond noise" if differ(base, other).beyond_noise else "within noise")
    return out


def _names(paths: list[Path]) -> list[str]:
    names = [p.name for p in paths]
    if len(set(names)) < len(names):  # e.g. two sweeps' variants/base: add the parent
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    return names


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _get(summary: dict, dotted: str) -> float | None:
    node = summary
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node):
        return None
    return float(node)


def delta_text(value: float | None, base: float | None, digits: int) -> str:
    """The change against the baseline: absolute, and relative where the baseline is not 0."""
    if value is None or base is None:
        return "–"
    diff = value - base
    if base == 0:
        return f"{diff:+,.{digits}f}"
    return f"{diff:+,.{digits}f} ({100 * diff / abs(base):+.1f} %)"


def write_compare_report(cmp: Comparison, out: Path, overwrite: bool = False) -> Path:
    """report.html in a new result folder `out`: the two tables, then the runs overlaid (interactive
    latency CDFs and KV usage over time, and the latency CDFs as a PNG)."""
    import html

    from servesim.plots import _save
    from servesim.plots.interactive import charts_html, overlay_charts
    from servesim.plots.report import write_report
    from servesim.plots.run import latency_cdfs
    from servesim.scenario.results import load_results
    from servesim.simulator.outdir import staged_output

    with staged_output(out, "compare", overwrite=overwrite) as tmp:
        runs = {name: load_results(folder) for name, folder in zip(cmp.names, cmp.folders)}
        fig = _save(latency_cdfs(runs, title="Latency CDFs"), tmp / "latency_cdfs.png")
        head = "<tr><th></th>" + "".join(f"<th>{html.escape(n)}</th>" for n in cmp.names) + "</tr>"
        rows = [f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in vals) + "</tr>"
                for k, vals in cmp.settings.items()]
        for (label, unit, digits, vals), noise in zip(cmp.metrics, cmp.noise):
            cells = [f"{vals[0]:,.{digits}f}" if vals[0] is not None else "–"]
            cells += [f"{v:,.{digits}f}<br><small>{delta_text(v, vals[0], digits)}{f' ({n})' if n else ''}</small>"
                      if v is not None else "–" for v, n in zip(vals[1:], noise)]
            rows.append(f"<tr><td>{html.escape(label)}{f' ({unit})' if unit else ''}</td>"
                        + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        table = f"<table>{head}{''.join(rows)}</table>"
        write_report(tmp, "servesim compare: " + " vs ".join(cmp.names),
                     "Settings that differ, then each metric with its change against the first run.",
                     table, [("Latency", [(fig, "TTFT, TPOT and E2E CDFs, one line per run")], False)],
                     charts_html(overlay_charts(runs)))
    return out / "report.html"
