"""Write a run's results atomically: everything goes into a staging folder renamed at the end, so a
killed run never leaves a result folder that looks complete. Which folders may be written (never one
servesim did not write) is decided by simulator.outdir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import yaml

from servesim.simulator.config import SimConfig, to_dict
from servesim.simulator.engine import EngineResult
from servesim.simulator.metrics import summarize
from servesim.simulator.outdir import check_output, make_staging, mark, publish_dir  # noqa: F401  (publish_dir: re-exported)


def build_summary(cfg: SimConfig, res: EngineResult, num_requests: int) -> dict:
    s = summarize(res.metrics, res.sim_duration_s, res.wall_time_s, cfg.slo, num_requests, res.prefix_hits,
                  res.prefix_queries)
    s["num_gpu_blocks"] = res.cache.num_gpu_blocks
    s["num_gpu_blocks_source"] = res.kv_capacity.source if res.kv_capacity is not None else "configured"
    s["sim_speedup_x"] = res.sim_duration_s / res.wall_time_s if res.wall_time_s > 0 else None
    return s


def write_results(out_dir: str | Path, cfg: SimConfig, res: EngineResult, summary: dict, workload_meta: dict,
                  step_trace_tmp: str | None = None, overwrite: bool = False) -> Path:
    tables = res.metrics.tables()  # the frames the summary was built from, not new ones
    resolved = to_dict(cfg)
    resolved["cache"] = to_dict(res.cache)
    resolved["workload"] = workload_meta
    return write_result_folder(out_dir, "replay", requests=tables.requests, steps=tables.steps,
                               timeseries=tables.timeseries(summary["sim_duration_s"]), config=resolved,
                               summary=summary, overwrite=overwrite)


def write_result_folder(out_dir: str | Path, kind: str, *, requests: pd.DataFrame, steps: pd.DataFrame,
                        timeseries: pd.DataFrame, config: dict, summary: dict, overwrite: bool = False) -> Path:
    """The one atomic result writer (replay and cluster runs): requests.parquet, steps.parquet,
    timeseries.csv, config.yaml, summary.json, written into a staging folder renamed at the end (a
    killed run leaves no complete-looking folder); `kind` goes into the folder's marker."""
    out_dir = check_output(out_dir, overwrite=overwrite)
    tmp = make_staging(out_dir)
    try:
        mark(tmp, kind)
        requests.to_parquet(tmp / "requests.parquet", index=False)
        steps.to_parquet(tmp / "steps.parquet", index=False)
        timeseries.to_csv(tmp / "timeseries.csv", index=False)
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=False) + "\n")
        publish_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
