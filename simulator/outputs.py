"""Write a run's results atomically: everything goes into a staging folder renamed at the end, so a
killed run never leaves a result folder that looks complete. Which folders may be written (never one
servesim did not write) is decided by simulator.outdir.

The tables go to files from their columns (simulator/columns.py) through Arrow and numpy, without
pandas: a replay never imports it. A table may also be a pandas DataFrame (a cluster's frames),
whose columns are read the same way. What pandas reads back is the frame the run's columns make:
the same columns, types and values (tests/test_requests_parquet.py).
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from servesim.simulator.columns import Columns
from servesim.simulator.config import SimConfig, to_dict
from servesim.simulator.engine_result import EngineResult
from servesim.simulator.outdir import check_output, make_staging, mark, naming, publish_dir  # noqa: F401  (publish_dir: re-exported)
from servesim.simulator.summary import summarize


def build_summary(cfg: SimConfig, res: EngineResult, num_requests: int) -> dict:
    s = summarize(res.metrics, res.sim_duration_s, res.wall_time_s, cfg.slo, num_requests, res.prefix_hits,
                  res.prefix_queries)
    s["num_gpu_blocks"] = res.cache.num_gpu_blocks
    s["num_gpu_blocks_source"] = res.kv_capacity.source if res.kv_capacity is not None else "configured"
    if res.cache.attention == "groups":  # a hybrid model's pool, as vLLM logs it (simulator/kv_groups.py)
        from servesim.simulator.kv_groups import kv_cache_report
        from servesim.simulator.startup import resolve_max_model_len

        s["kv_cache_groups"] = {**kv_cache_report(res.cache.kv_cache_groups, res.cache.num_gpu_blocks,
                                                  resolve_max_model_len(cfg), cfg.scheduler.max_num_batched_tokens),
                                "mamba_cache_mode": res.cache.mamba_cache_mode}
    s["sim_speedup_x"] = res.sim_duration_s / res.wall_time_s if res.wall_time_s > 0 else None
    # Whether the fast path ran beside the engine, and if not why (simulator/fastpath/planner_for).
    s["fast_path"] = {"used": res.planner_declined is None, "declined_reason": res.planner_declined}
    if res.hicache is not None:
        s["hicache"] = hicache_summary(res.hicache, res.prefix_hits)
    if res.kv_offload is not None:
        s["kv_offload"] = res.kv_offload.summary()
    if res.encoder_cache is not None:  # beside the prefix-cache figures: embeddings, not tokens of text
        ec = res.encoder_cache
        s["encoder_cache_hit_rate"] = ec.hits / ec.queries if ec.queries else 0.0
        s["encoder_cache_hit_tokens"] = ec.hits
        s["encoder_cache_query_tokens"] = ec.queries
    return s


def hicache_summary(hc, prefix_hits: int) -> dict:
    """SGLang HiCache's host tier beside the prefix-cache figures: prefix_cache_hit_tokens counts
    every cached prefix token (device hits and tokens loaded from host); host_hit_tokens is the
    part loaded from host, device_hit_tokens the rest (both of requests never preempted, as the
    prefix-cache figures)."""
    return {"host_hit_tokens": hc.host_hit_tokens, "device_hit_tokens": max(prefix_hits - hc.host_hit_tokens, 0),
            "load_bytes": hc.load_bytes, "write_bytes": hc.write_bytes,
            "num_loads": hc.num_loads, "num_writes": hc.num_writes}


HICACHE_SERIES = ("hicache_host_hit_tokens", "hicache_load_bytes", "hicache_write_bytes")


def with_hicache_series(ts: Columns, rows: list[tuple[float, int, int, int]]) -> Columns:
    """The 1-second series plus SGLang HiCache's per-second figures beside the others: host-tier
    hit tokens, bytes loaded and written in [t, t + 1), by the time each step's output was applied."""
    return with_step_series(ts, rows, HICACHE_SERIES)


def with_step_series(ts: Columns, rows: list[tuple], names: tuple[str, ...]) -> Columns:
    """The 1-second series plus per-second sums of per-step figures: rows are (time s, one integer
    per name), each counted in the second [t, t + 1) holding its time."""
    ticks = np.asarray(ts["t_s"])
    data = {name: ts.raw(name) for name in ts.columns}
    if rows:
        at = np.asarray([r[0] for r in rows])
        # per step, the tick it belongs to (steps after the last tick count in the last one)
        idx = np.clip(np.searchsorted(ticks, at, side="right") - 1, 0, len(ticks) - 1)
    for i, name in enumerate(names, start=1):
        col = np.zeros(len(ticks), dtype=np.int64)
        if rows:
            np.add.at(col, idx, np.asarray([r[i] for r in rows], dtype=np.int64))
        data[name] = col
    return Columns(data, [*ts.columns, *names])


def write_results(out_dir: str | Path, cfg: SimConfig, res: EngineResult, summary: dict, workload_meta: dict,
                  step_trace_tmp: str | None = None, overwrite: bool = False, identity: dict | None = None) -> Path:
    """config.yaml is the run's settings as resolved, re-runnable as a scenario (`servesim run
    RUN/config.yaml`): the KV pool the run derived from GPU memory is written as its size, and the
    workload as the `workload:` section that rebuilt it (workload_meta["spec"]; a workload built
    by hand has none and is described instead)."""
    cols = res.metrics.columns()  # the columns the summary was built from, not new ones
    resolved = to_dict(cfg)
    resolved["cache"] = to_dict(res.cache)
    if resolved.get("derive_num_gpu_blocks"):
        resolved["derive_num_gpu_blocks"] = False  # cache.num_gpu_blocks holds what was derived
    spec = workload_meta.get("spec")
    resolved["workload"] = spec if spec is not None else {k: v for k, v in workload_meta.items() if k != "spec"}
    identity = {**(identity or {}), "workload": {k: v for k, v in workload_meta.items() if k != "spec"},
                "num_gpu_blocks_derived": bool(cfg.derive_num_gpu_blocks)}
    timeseries = cols.timeseries(summary["sim_duration_s"])
    if res.hicache is not None:
        timeseries = with_hicache_series(timeseries, res.hicache_rows or [])
    if res.kv_offload is not None:
        timeseries = res.kv_offload.with_series(timeseries, with_step_series)
    return write_result_folder(out_dir, "replay", requests=cols.requests,
                               steps=cols.steps if cols.folds.rows_kept else None,
                               timeseries=timeseries, config=resolved,
                               summary=summary, overwrite=overwrite, identity=identity)


def _columns(table) -> Columns:
    return table if isinstance(table, Columns) else Columns.of_frame(table)


def _arrow_column(cols: Columns, name: str, pa):
    """One column as an Arrow array: numbers as they are (NaN a null), strings as large strings (as
    pandas hands them over), a column of None alone as nulls, each request's gaps as one list array
    (offsets and every gap end to end: no conversion per request). Built from the arrays' buffers:
    pyarrow's own conversions import pandas."""
    n = len(cols)
    if name in cols.none_in_frame:
        return pa.nulls(n)
    flat = cols.flat(name)
    if flat is not None:  # the rows' values already end to end (a run's pooled gaps: no view per row built)
        return _list_array(flat.values, flat.offsets, pa)
    values = cols.raw(name)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return _numbers_array(values, pa)
    items = values if isinstance(values, list) else values.tolist()
    kinds = set(map(type, items))  # (a set of types, in C: no per-value Python check on the usual tables)
    if kinds <= {type(None)}:
        return pa.nulls(n)
    if kinds <= {str, type(None)}:
        return _strings_array(items, pa)
    if kinds <= {np.ndarray, list} and all(len(v) == 0 if type(v) is list else v.dtype == np.float64 and v.ndim == 1
                                          for v in items):
        return _gaps_array(items, pa)
    missing = [v is None or (isinstance(v, float) and v != v) for v in items]  # NaN: a frame's missing value
    present = [None if m else v for v, m in zip(items, missing)]
    if all(m or isinstance(v, str) for v, m in zip(items, missing)):
        return _strings_array(present, pa)
    return pa.array(present)  # anything else: pyarrow's inference (which imports pandas)


def _validity(present: np.ndarray, pa):
    """An Arrow validity bitmap (None when every value is present)."""
    return None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))


def _numbers_array(values: np.ndarray, pa):
    values = np.ascontiguousarray(values)
    kind = pa.from_numpy_dtype(values.dtype)
    validity = _validity(~np.isnan(values), pa) if values.dtype.kind == "f" else None
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(values)])


def _strings_array(items: list, pa):
    """Strings (None: missing) as a large-string array, from one buffer of every string end to end."""
    n = len(items)
    present = [v is not None for v in items]
    texts = items if all(present) else [v if v is not None else "" for v in items]
    joined = "".join(texts)
    if joined.isascii():  # a character a byte: the offsets are the strings' lengths
        data, lens = joined.encode("ascii"), np.fromiter(map(len, texts), dtype=np.int64, count=n)
    else:
        encoded = [t.encode() for t in texts]
        data, lens = b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return pa.Array.from_buffers(pa.large_string(), n, [_validity(np.array(present, dtype=bool), pa),
                                                        pa.py_buffer(offsets), pa.py_buffer(data)])


def _gaps_array(items: list, pa):
    """Float arrays (or [] for none), one per row, as one Arrow list array built from their offsets
    and every value end to end."""
    lens = np.fromiter((len(v) for v in items), dtype=np.int64, count=len(items))
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    parts = [v for v in items if len(v)]
    return _list_array(np.concatenate(parts) if parts else np.empty(0), offsets, pa)


def _list_array(values: np.ndarray, offsets: np.ndarray, pa):
    """Rows values[offsets[i]:offsets[i + 1]] (offsets from 0) as an Arrow list array: 32-bit
    offsets while they fit, else a large list; no value at all: a list of nulls, as pandas types
    a column of empty lists."""
    total = int(offsets[-1])
    offsets = offsets.astype(np.int32 if total < 2**31 else np.int64, copy=False)
    flat = _numbers_array(values, pa) if total else pa.nulls(0)
    if offsets.dtype == np.int32:
        return pa.ListArray.from_arrays(_numbers_array(offsets, pa), flat)
    return pa.LargeListArray.from_arrays(_numbers_array(offsets, pa), flat)


# Rows per Parquet row group of a large table: each group's Arrow arrays are built, encoded and
# written before the next (a 1 M-request table's strings, gaps and encoded pages are never all in
# memory at once); a smaller table is one group, as before.
ROW_GROUP_ROWS = 131_072


def write_parquet(table, path: Path, dictionary: tuple[str, ...] = ()) -> None:
    """A table to a parquet file (snappy, as pandas writes it). Dictionary encoding only for
    the columns named in `dictionary` and the string columns but request_id: floats are nearly
    all distinct (a dictionary of them was half of the Azure hour's writing, and its
    requests.parquet was 8.6 MB with it, 6.9 MB without), unique ids likewise. A table longer
    than ROW_GROUP_ROWS is written in row groups of that many rows, one at a time, under the
    whole table's schema (a column of None alone in one group is typed as in the whole)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = _columns(table)
    schema = _schema(cols, pa) if len(cols) > ROW_GROUP_ROWS else None
    if schema is None:  # one group (or a column only pyarrow's own inference can type: whole)
        out = pa.table([_arrow_column(cols, name, pa) for name in cols.columns], names=cols.columns)
        pq.write_table(out, path, compression="snappy", use_dictionary=_dictionary_columns(out.schema, dictionary, pa))
        return
    with pq.ParquetWriter(path, schema, compression="snappy",
                          use_dictionary=_dictionary_columns(schema, dictionary, pa)) as writer:
        for start in range(0, len(cols), ROW_GROUP_ROWS):
            part = cols.rows(start, min(start + ROW_GROUP_ROWS, len(cols)))
            arrays = [_arrow_column(part, f.name, pa) for f in schema]
            writer.write_table(pa.table([a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema)],
                                        schema=schema))
            del part, arrays


def _dictionary_columns(schema, dictionary: tuple[str, ...], pa) -> list[str]:
    return [f.name for f in schema if f.name in dictionary or (pa.types.is_large_string(f.type)
                                                               and f.name != "request_id")]


def _schema(cols: Columns, pa):
    """The Arrow schema _arrow_column gives the whole table, found without converting it; None
    when a column needs pyarrow's own inference (then the table is written whole)."""
    fields = []
    for name in cols.columns:
        flat = cols.flat(name)
        values = None if flat is not None else cols.raw(name)  # (a flat column's rows are never listed)
        if name in cols.none_in_frame:
            kind = pa.null()
        elif flat is not None:
            total = int(flat.offsets[-1])
            kind = pa.list_(pa.float64()) if total < 2**31 else pa.large_list(pa.float64())
            if total == 0:
                kind = pa.list_(pa.null())
        elif isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
            kind = pa.from_numpy_dtype(values.dtype)
        else:
            items = values if isinstance(values, list) else values.tolist()
            kinds = set(map(type, items))
            if kinds <= {type(None)}:
                kind = pa.null()
            elif kinds <= {str, type(None)}:
                kind = pa.large_string()
            elif kinds <= {np.ndarray, list} and all(len(v) == 0 if type(v) is list else
                                                     v.dtype == np.float64 and v.ndim == 1 for v in items):
                total = sum(map(len, items))
                kind = pa.list_(pa.float64()) if total < 2**31 else pa.large_list(pa.float64())
                if total == 0:
                    kind = pa.list_(pa.null())
            else:
                return None
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


# Per-request and per-step columns with few distinct values (counts, reasons): dictionary-encoded.
_REQUEST_DICTIONARY = ("prompt_len", "output_len", "output_len_target", "num_preemptions", "num_cached_tokens")
_STEP_DICTIONARY = ("replica", "num_requests", "num_prefill_tokens", "num_decode_tokens", "num_running",
                    "num_waiting", "num_preemptions", "prefix_hit_tokens", "prefix_query_tokens")


def write_requests_parquet(requests, path: Path) -> None:
    """requests.parquet: one row per request, each request's inter-token gaps a list of floats."""
    write_parquet(requests, path, _REQUEST_DICTIONARY)


def write_csv(table, path: Path) -> None:
    """A table of numbers as CSV, as pandas' to_csv(index=False) writes it (numpy's shortest
    float repr, an empty cell for NaN)."""
    cols = _columns(table)
    cells = []
    for name in cols.columns:
        values = cols[name]
        if values.dtype.kind not in "biuf":
            raise TypeError(f"write_csv writes numbers; column {name!r} holds {values.dtype}")
        text = values.astype(str)
        if values.dtype.kind == "f":
            text = np.where(np.isnan(values), "", text)
        cells.append(text.tolist())
    lines = [",".join(cols.columns)] + [",".join(row) for row in zip(*cells)]
    path.write_text("\n".join(lines) + "\n")


def _write_tables(requests, steps, tmp: Path) -> None:
    """requests.parquet and steps.parquet, side by side: Parquet's encoding and compression release
    the GIL, so the two files are encoded at once on two cores (the Azure hour's: 141 and 84 ms
    one after the other). Each file's bytes are what one thread writes; an error in either is
    raised here once both are done (the staging folder is then removed whole)."""
    if steps is None:
        write_requests_parquet(requests, tmp / "requests.parquet")
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="servesim-steps") as pool:
        steps_written = pool.submit(write_parquet, steps, tmp / "steps.parquet", _STEP_DICTIONARY)
        write_requests_parquet(requests, tmp / "requests.parquet")
    steps_written.result()  # (leaving the pool waited for it: no file is left being written)


def write_result_folder(out_dir: str | Path, kind: str, *, requests, steps, timeseries, config: dict, summary: dict,
                        overwrite: bool = False, identity: dict | None = None,
                        extra_csv: dict | None = None) -> Path:
    """The one atomic result writer (replay and cluster runs): requests.parquet, steps.parquet,
    timeseries.csv, config.yaml, summary.json (and run.json, the run's identity, when given; NAME.csv for each extra_csv table), written into a staging folder renamed at the end (a
    killed run leaves no complete-looking folder); `kind` goes into the folder's marker. The
    tables are Columns or pandas DataFrames; steps None: a run that kept no step rows (step_rows:
    false) has no steps.parquet."""
    out_dir = check_output(out_dir, overwrite=overwrite)
    tmp = make_staging(out_dir)
    try:
        with naming(out_dir):  # a full disk names the result folder, not nothing
            mark(tmp, kind)
            _write_tables(requests, steps, tmp)
            write_csv(timeseries, tmp / "timeseries.csv")
            (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=False) + "\n")
            for name, table in (extra_csv or {}).items():  # e.g. a cluster's autoscaling tables: NAME.csv
                table.to_csv(tmp / f"{name}.csv", index=False)
            if identity is not None:  # servesim/identity.py: what produced the folder
                (tmp / "run.json").write_text(json.dumps(identity, indent=1, default=str) + "\n")
            publish_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
