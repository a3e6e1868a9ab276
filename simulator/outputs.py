"""Write a run's results atomically: everything goes into a staging folder renamed at the end, so a
killed run never leaves a result folder that looks complete. Which folders may be written (never one
servesim did not write) is decided by simulator.outdir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
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


def write_requests_parquet(requests: pd.DataFrame, path: Path) -> None:
    """`requests.to_parquet(path, index=False)`, byte for byte, with the inter-token gaps (itl_s:
    a float64 array or [] per request) handed to Arrow as one list array (offsets + the gaps end
    to end) instead of one conversion per request: the Azure hour's 19 k requests and 4 M gaps
    cost ~0.1 s of the replay that way. The schema (types and pandas metadata) is the one Arrow
    infers from a few sample rows, checked against the rest, so readers see the same file. Frames
    the fast path does not cover (no gap at all, an itl_s value that is not a float64 array, more
    than 2^31 gaps) take to_parquet itself."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _requests_table(requests, pa)
    if table is None:
        requests.to_parquet(path, index=False)
    else:  # pandas' to_parquet writes its table with these very arguments
        pq.write_table(table, path, compression="snappy")


def _requests_table(requests: pd.DataFrame, pa):
    """The Arrow table pyarrow.Table.from_pandas(requests) builds, or None where the fast path
    does not apply (write_requests_parquet)."""
    if "itl_s" not in requests.columns or requests.columns.has_duplicates:
        return None
    values = requests["itl_s"].to_numpy()  # object array: one float64 array or [] per row
    lens = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    rows = np.flatnonzero(lens)
    if rows.size == 0 or int(lens.sum()) >= 2**31:  # Arrow's list offsets are int32
        return None
    parts = [values[i] for i in rows.tolist()]
    if not all(isinstance(v, np.ndarray) and v.dtype == np.float64 and v.ndim == 1 for v in parts):
        return None
    # The schema Arrow infers from a few rows: one with gaps, and each other object column's first
    # value that is not None (an all-None column is typed null, as it is in the whole frame).
    sample = {int(rows[0])}
    for name in requests.columns:
        if name != "itl_s" and requests[name].dtype == object:
            present = requests[name].notna().to_numpy()
            if present.any():
                sample.add(int(present.argmax()))
    reference = pa.Table.from_pandas(requests.iloc[sorted(sample)], preserve_index=False).schema
    field = reference.field("itl_s")
    if field.type != pa.list_(pa.float64()):
        return None
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    gaps = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(parts)))
    rest = pa.Table.from_pandas(requests.drop(columns=["itl_s"]), preserve_index=False)
    table = rest.add_column(requests.columns.get_loc("itl_s"), field, gaps)
    if (table.schema.remove_metadata() != reference.remove_metadata()
            or _pandas_meta(rest.schema, None) != _pandas_meta(reference, "itl_s")):
        return None  # another column's type depends on its values (e.g. all None): the plain path
    return table.replace_schema_metadata(reference.metadata)


def _pandas_meta(schema, without: str | None) -> dict:
    """The pandas metadata Arrow wrote into `schema`, less the column named `without`."""
    meta = json.loads(schema.metadata[b"pandas"])
    meta["columns"] = [c for c in meta["columns"] if c["name"] != without]
    return meta


def write_result_folder(out_dir: str | Path, kind: str, *, requests: pd.DataFrame, steps: pd.DataFrame,
                        timeseries: pd.DataFrame, config: dict, summary: dict, overwrite: bool = False) -> Path:
    """The one atomic result writer (replay and cluster runs): requests.parquet, steps.parquet,
    timeseries.csv, config.yaml, summary.json, written into a staging folder renamed at the end (a
    killed run leaves no complete-looking folder); `kind` goes into the folder's marker."""
    out_dir = check_output(out_dir, overwrite=overwrite)
    tmp = make_staging(out_dir)
    try:
        mark(tmp, kind)
        write_requests_parquet(requests, tmp / "requests.parquet")
        steps.to_parquet(tmp / "steps.parquet", index=False)
        timeseries.to_csv(tmp / "timeseries.csv", index=False)
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=False) + "\n")
        publish_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
