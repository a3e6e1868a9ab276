"""Samplers behind the synthetic generators: arrival processes and value distributions.

All randomness comes from the one `numpy.random.Generator` the caller passes in, so a seed fully
determines the output. Arrival times start at t = 0 (the first request arrives at the start of
the trace, like the real traces) and then follow the configured inter-arrival gaps.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from servesim.traces.errors import InputError
from servesim.traces.synthetic_config import ArrivalConfig, DistConfig

# Column names that mean "prompt tokens" / "output tokens" in the length datasets we know.
PROMPT_COLUMNS = ("num_prefill_tokens", "input_toks", "prompt_len", "input_length",
                  "ContextTokens")
OUTPUT_COLUMNS = ("num_decode_tokens", "output_toks", "output_len", "output_length",
                  "GeneratedTokens")


def arrival_gaps(config: ArrivalConfig, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` inter-arrival gaps in seconds with mean 1/rate_per_s."""
    mean_gap_s = 1.0 / config.rate_per_s
    if config.process == "poisson":
        return rng.exponential(mean_gap_s, count)
    if config.process == "gamma":
        shape = 1.0 / (config.cv * config.cv)  # CV of a gamma variable is 1/sqrt(shape)
        return rng.gamma(shape, mean_gap_s / shape, count)
    return np.full(count, mean_gap_s)  # constant


def arrival_times(
    config: ArrivalConfig,
    rng: np.random.Generator,
    *,
    num: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Arrival times in seconds: t0 = 0, at most `num` of them, all < `duration_s` when given."""
    if num is None and duration_s is None:
        raise InputError("need num or duration_s", field="num_requests",
                         allowed="num_requests and/or duration_s")
    if duration_s is None:
        gaps = arrival_gaps(config, max(num - 1, 0), rng)
        return np.concatenate(([0.0], np.cumsum(gaps)))[:num]
    # Duration-bound: draw gaps in chunks sized from the expected count until past duration_s.
    chunk = max(64, math.ceil(config.rate_per_s * duration_s * 1.1))
    if num is not None:
        chunk = min(chunk, max(num, 1))
    pieces = [np.zeros(1)]
    last, total = 0.0, 1
    while last < duration_s and (num is None or total < num):
        times = last + np.cumsum(arrival_gaps(config, chunk, rng))
        pieces.append(times)
        last, total = float(times[-1]), total + chunk
    times = np.concatenate(pieces)
    times = times[times < duration_s]
    return times if num is None else times[:num]


def sample_values(
    config: DistConfig, count: int, rng: np.random.Generator, *, integer: bool,
    default_column: str = "prompt",
) -> np.ndarray:
    """`count` samples of `config` (clipped to [min_value, max_value]); int64 when `integer`.

    `default_column` is the empirical column used when the config names none.
    """
    dist = config.dist
    if dist == "fixed":
        values = np.full(count, float(config.value))
    elif dist == "uniform":
        if integer:
            low, high = math.ceil(config.low), math.floor(config.high)
            if high < low:
                raise InputError(f"no integer in [{config.low}, {config.high}]", field="low",
                                 allowed="bounds that contain an integer")
            values = rng.integers(low, high + 1, count).astype(np.float64)
        else:
            values = rng.uniform(config.low, config.high, count)
    elif dist == "lognormal":
        sigma = float(config.sigma)
        # median = exp(mu); mean = exp(mu + sigma^2 / 2)
        mu = math.log(config.median) if config.median is not None else (
            math.log(config.mean) - sigma * sigma / 2.0)
        values = rng.lognormal(mu, sigma, count)
    elif dist == "exponential":
        values = rng.exponential(config.mean, count)
    else:  # empirical
        table = length_table(config.path, config.column or default_column)
        values = table[rng.integers(0, len(table), count)].astype(np.float64)
    return clip_round(values, config, integer=integer)


def clip_round(values: np.ndarray, config: DistConfig, *, integer: bool) -> np.ndarray:
    """Clip to the config's [min_value, max_value]; round to int64 when `integer`."""
    if config.min_value is not None or config.max_value is not None:
        values = np.clip(values, config.min_value, config.max_value)
    return np.rint(values).astype(np.int64) if integer else values


def length_table(path: str, column: str) -> np.ndarray:
    """Values of `column` ("prompt", "output" or a column name) from a length dataset or trace."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise InputError("empirical length file not found", path=str(path), field="path")
    return _length_table(str(resolved), column, resolved.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _length_table(path: str, column: str, _mtime_ns: int) -> np.ndarray:
    from servesim.traces.registry import encoding_of  # local: avoid import cycles at module load
    from servesim.traces.rows import int_column, read_csv

    file = Path(path)
    if encoding_of(file) == "csv":
        frame = read_csv(file, ())
        name = _resolve_column(column, list(frame.columns), file)
        table = int_column(frame, name, file, min_value=0)
    else:
        import inspect

        from servesim.traces.formats import load_workload, sniff_format
        from servesim.traces.registry import get_format

        # Only the lengths are read: a file without arrival times (raw ShareGPT, a length-only
        # trace) is loaded with every request at t = 0 rather than refused for want of a rate.
        params = inspect.signature(get_format(sniff_format(file)).loader).parameters
        workload = load_workload(file, **({"rate_per_s": math.inf} if "rate_per_s" in params else {}))
        if column in ("prompt", "prompt_len"):
            table = np.array([r.prompt_len for r in workload.requests], dtype=np.int64)
        elif column in ("output", "output_len"):
            table = np.array([r.output_len for r in workload.requests], dtype=np.int64)
        else:
            raise InputError(f"unknown column {column!r} for a trace file", path=path,
                             field="column", allowed="prompt, output")
    table.setflags(write=False)
    return table


def _resolve_column(column: str, columns: list[str], file: Path) -> str:
    aliases = {"prompt": PROMPT_COLUMNS, "output": OUTPUT_COLUMNS}.get(column, (column,))
    for name in aliases:
        if name in columns:
            return name
    raise InputError(f"no column for {column!r} (header: {', '.join(columns)})", path=str(file),
                     field="column", allowed=f"prompt, output or one of {', '.join(columns)}")
