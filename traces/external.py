"""Loaders for public trace formats: Mooncake, Azure LLM inference 2023, length datasets, and the
LLMServingSim workload JSONL. Units are converted to seconds; nothing is tokenised at load time.
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path

import numpy as np

from servesim.traces.distributions import OUTPUT_COLUMNS, PROMPT_COLUMNS, arrival_times
from servesim.traces.errors import InputError
from servesim.traces.registry import register_format
from servesim.traces.rows import (
    as_float,
    as_int,
    as_int_tuple,
    check_sorted,
    check_sorted_column,
    datetime_ns_column,
    float_column,
    int_column,
    iter_json_rows,
    read_csv,
    require_keys,
    require_rows,
)
from servesim.traces.spec_columns import SpecColumns
from servesim.traces.synthetic_config import ArrivalConfig
from servesim.traces.tokens import TOKEN_ID_LIMIT
from servesim.traces.workload import DEFAULT_PREFIX_BLOCK_LEN, RequestSpec, Workload

_SORT_NOTE = "{fmt} traces are sorted by arrival; pass require_sorted=False to sort on load"


def trace_name(path: Path) -> str:
    """File name without .gz and the format extension."""
    name = path.name
    for ext in (".gz", ".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".pq"):
        name = name.removesuffix(ext)
    return name


def _finish(requests: list[RequestSpec], times: list[float], lines: list[int], path: Path,
            field: str, fmt: str, require_sorted: bool) -> Workload:
    require_rows(len(requests), path)
    if require_sorted:
        check_sorted(times, lines, path, field, _SORT_NOTE.format(fmt=fmt))
        return Workload(requests, name=trace_name(path), source=str(path))
    return Workload.from_unsorted(requests, name=trace_name(path), source=str(path))


@register_format(
    "mooncake",
    signatures=(("timestamp", "input_length", "output_length"),),
    encodings=("jsonl",),
)
def load_mooncake(path: Path, *, block_len: int = DEFAULT_PREFIX_BLOCK_LEN,
                  require_sorted: bool = True) -> Workload:
    """Mooncake FAST'25 JSONL: timestamp (ms), input_length, output_length, hash_ids.

    One hash id per `block_len` (512) prompt tokens; equal leading ids mean a shared prefix.
    """
    requests: list[RequestSpec] = []
    times: list[float] = []
    lines: list[int] = []
    for line, obj in iter_json_rows(path):
        require_keys(obj, ("timestamp", "input_length", "output_length"), path, line)
        ts_ms = as_float(obj["timestamp"], path=path, line=line, field="timestamp")
        prompt_len = as_int(obj["input_length"], path=path, line=line, field="input_length",
                            min_value=1)
        output_len = as_int(obj["output_length"], path=path, line=line, field="output_length",
                            min_value=1)
        hashes = obj.get("hash_ids")
        if hashes is not None:
            hashes = as_int_tuple(hashes, path=path, line=line, field="hash_ids")
            max_blocks = -(-prompt_len // block_len)
            if len(hashes) > max_blocks:
                raise InputError(
                    f"{len(hashes)} hash ids for input_length {prompt_len}",
                    path=str(path), line=line, field="hash_ids",
                    allowed=f"at most ceil(input_length/{block_len}) = {max_blocks} ids",
                )
        requests.append(RequestSpec(
            request_id=f"mooncake-{len(requests)}", arrival_time_s=ts_ms / 1000.0,
            prompt_len=prompt_len, output_len=output_len, prefix_hash_ids=hashes or None,
            prefix_block_len=block_len,
        ))
        times.append(ts_ms)
        lines.append(line)
    return _finish(requests, times, lines, path, "timestamp", "Mooncake", require_sorted)


@register_format(
    "azure",
    signatures=(("TIMESTAMP", "ContextTokens", "GeneratedTokens"),),
    encodings=("csv",),
)
def load_azure(path: Path, *, require_sorted: bool = True) -> Workload:
    """Azure LLM inference 2023 CSV: TIMESTAMP (absolute), ContextTokens, GeneratedTokens."""
    frame = read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    ns = datetime_ns_column(frame, "TIMESTAMP")
    missing = ns == np.iinfo(np.int64).min  # NaT
    if missing.any():
        row = int(np.argmax(missing))
        raise InputError(f"bad timestamp {frame['TIMESTAMP'][row]!r}", path=str(path),
                         line=row + 2, field="TIMESTAMP",
                         allowed="a date-time like 2023-11-16 18:17:03.9799600")
    if require_sorted:
        check_sorted_column(ns, path, "TIMESTAMP", _SORT_NOTE.format(fmt="Azure"))
    seconds = (ns - ns.min()) / 1e9  # relative to the first arrival
    prompt = int_column(frame, "ContextTokens", path, min_value=1)
    output = int_column(frame, "GeneratedTokens", path, min_value=1)
    if not require_sorted:
        requests = [RequestSpec(f"azure-{i}", float(t), int(p), int(o))
                    for i, (t, p, o) in enumerate(zip(seconds.tolist(), prompt.tolist(), output.tolist()))]
        return _sorted_or_not(requests, path, require_sorted)
    # Sorted (checked above): the workload's columns straight from these, no RequestSpec per row.
    # Every field a plain spec's checks read is valid already (RequestSpec._problem: a non-empty
    # id, an arrival finite and >= 0 (ns - min, exact int64), both lengths >= 1: int_column), and
    # the values are those RequestSpec would hold (float64 seconds, int64 lengths).
    columns = SpecColumns()
    columns.request_ids = [f"azure-{i}" for i in range(len(seconds))]
    columns.arrival_times_s = array("d", seconds.astype(np.float64).tobytes())
    columns.prompt_lens = array("q", prompt.astype(np.int64).tobytes())
    columns.output_lens = array("q", output.astype(np.int64).tobytes())
    return _sorted_or_not(columns, path, require_sorted)


def _sorted_or_not(requests: list[RequestSpec] | SpecColumns, path: Path, already_sorted: bool) -> Workload:
    if already_sorted:
        return Workload(requests, name=trace_name(path), source=str(path))
    return Workload.from_unsorted(requests, name=trace_name(path), source=str(path))


@register_format(
    "lengths",
    signatures=(("num_prefill_tokens", "num_decode_tokens"), ("input_toks", "output_toks")),
    encodings=("csv",),
)
def load_lengths(
    path: Path,
    *,
    rate_per_s: float | None = None,
    process: str = "poisson",
    cv: float | None = None,
    seed: int = 0,
    num_requests: int | None = None,
) -> Workload:
    """Length-only CSV (etalon/Vidur num_prefill_tokens, num_decode_tokens) + generated arrivals.

    Arrivals come from the synthetic arrival process (`process`, `rate_per_s`, `cv`) seeded with
    `seed`; `rate_per_s` inf sends every request at t = 0 (vllm bench's `--request-rate inf`). When the file has an `arrival_time_s` column and no rate is given, those are used.
    Rows are taken in file order; `num_requests` keeps the first N.
    """
    frame = read_csv(path, ())
    columns = list(frame.columns)
    prompt_col = next((c for c in PROMPT_COLUMNS if c in columns), None)
    output_col = next((c for c in OUTPUT_COLUMNS if c in columns), None)
    for col, options in ((prompt_col, PROMPT_COLUMNS), (output_col, OUTPUT_COLUMNS)):
        if col is None:
            raise InputError(f"no length column (header: {', '.join(columns)})", path=str(path),
                             line=1, field=options[0], allowed=" or ".join(options))
    if num_requests is not None:
        if num_requests < 1:
            raise InputError(f"num_requests {num_requests}", field="num_requests",
                             allowed="an integer >= 1")
        frame = frame.head(num_requests)
    prompt = int_column(frame, prompt_col, path, min_value=1)
    output = int_column(frame, output_col, path, min_value=1)
    if rate_per_s is None and "arrival_time_s" in columns:
        times = float_column(frame, "arrival_time_s", path, min_value=0.0)
        source = str(path)
    elif rate_per_s is None:
        raise InputError("length-only trace has no arrival times", path=str(path), field="rate_per_s",
                         allowed="a rate: --request-rate R (and --burstiness) on the command line, "
                                 "rate_per_s (and process, cv, seed) in Python or YAML options")
    elif rate_per_s == math.inf:  # vllm bench's --request-rate inf: every request at t = 0
        times = np.zeros(len(frame))
        source = f"{path} with every request at t = 0"
    else:
        arrival = ArrivalConfig(process=process, rate_per_s=rate_per_s, cv=cv)
        times = arrival_times(arrival, np.random.default_rng(seed), num=len(frame))
        source = f"{path} with {process} arrivals at {rate_per_s:g}/s (cv={cv}, seed={seed})"
    requests = [
        RequestSpec(f"lengths-{i}", float(t), int(p), int(o))
        for i, (t, p, o) in enumerate(zip(times.tolist(), prompt.tolist(), output.tolist()))
    ]
    return Workload.from_unsorted(requests, name=trace_name(path), source=source)


@register_format(
    "llmservingsim",
    signatures=(("input_toks", "output_toks", "arrival_time_ns"),),
    encodings=("jsonl",),
)
def load_llmservingsim(path: Path, *, require_sorted: bool = True,
                       keep_token_ids: bool = True) -> Workload:
    """LLMServingSim workload JSONL: input_toks, output_toks, arrival_time_ns, input_tok_ids."""
    requests: list[RequestSpec] = []
    times: list[float] = []
    lines: list[int] = []
    for line, obj in iter_json_rows(path):
        require_keys(obj, ("input_toks", "output_toks", "arrival_time_ns"), path, line)
        ns = as_float(obj["arrival_time_ns"], path=path, line=line, field="arrival_time_ns")
        prompt_len = as_int(obj["input_toks"], path=path, line=line, field="input_toks",
                            min_value=1)
        output_len = as_int(obj["output_toks"], path=path, line=line, field="output_toks",
                            min_value=1)
        ids = obj.get("input_tok_ids") if keep_token_ids else None
        if ids is not None:
            ids = as_int_tuple(ids, path=path, line=line, field="input_tok_ids",
                               upper=TOKEN_ID_LIMIT)
            if len(ids) != prompt_len:
                raise InputError(
                    f"{len(ids)} token ids but input_toks is {prompt_len}", path=str(path),
                    line=line, field="input_tok_ids", allowed="len(input_tok_ids) == input_toks",
                )
        requests.append(RequestSpec(
            request_id=f"llmservingsim-{len(requests)}", arrival_time_s=ns / 1e9,
            prompt_len=prompt_len, output_len=output_len, prompt_token_ids=ids,
        ))
        times.append(ns)
        lines.append(line)
    return _finish(requests, times, lines, path, "arrival_time_ns", "LLMServingSim",
                   require_sorted)
