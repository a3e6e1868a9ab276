"""ServeGen (alibaba/ServeGen, Apache-2.0; arXiv:2505.09999) client characterisations, as requests.

ServeGen publishes no per-request records: each client of a model has a day of 10-minute windows
(`chunk-<client>-trace.csv`, no header) and length distributions per 6-hour window
(`chunk-<client>-dataset.json`). This loader reads one client's trace CSV (`--format servegen`:
a headerless file cannot be sniffed) and the dataset JSON beside it, or every client in that
folder (`all_clients=True`), and draws requests over [start_s, start_s + duration_s):

- trace rows `window_start_s, rate, cv, pattern, shape, scale`: in each window with a pattern
  (Gamma or Weibull; empty: no traffic) the gaps follow that family with the fitted `shape`, its
  scale set so the mean gap is 1/`rate` (ServeGen's generator likewise draws each window's gaps
  at a target rate); the first request comes one gap after the window (or range) starts;
- dataset keys: the start (s) of each 6-hour window; `input_tokens` / `output_tokens` are Python
  dict literals `{tokens: probability}` (read with ast.literal_eval, which evaluates no code), drawn
  independently per request from the window the request arrives in. `reason_ratio` (the share of
  reasoning tokens in the output) is not used: the output length already counts them.

Times are rebased so the range starts at 0. One seed (`seed`) draws everything; clients draw in
file-name order. A malformed row or distribution is an InputError naming file, line and field.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from pathlib import Path

import numpy as np

from servesim.traces.errors import InputError
from servesim.traces.registry import register_format
from servesim.traces.rows import open_text
from servesim.traces.workload import RequestSpec, Workload

WINDOW_S = 600.0  # ServeGen trace windows are 10 minutes (data README)
PATTERNS = ("", "Gamma", "Weibull")
ATTRIBUTION = "ServeGen (github.com/alibaba/ServeGen), Apache-2.0"
_TRACE_NAME = re.compile(r"chunk-(\d+)-trace\.csv$")


def _trace_rows(path: Path) -> list[tuple[float, float, str, float]]:
    """(window_start_s, rate, pattern, shape) of every row, validated."""
    rows = []
    with open_text(path) as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            if len(row) != 6:
                raise InputError(f"{len(row)} fields", path=str(path), line=line,
                                 allowed="6 fields: window_start_s, rate, cv, pattern, shape, scale")
            try:
                start, rate, shape = float(row[0]), float(row[1]), float(row[4])
            except ValueError:
                raise InputError(f"not a number in {row!r}", path=str(path), line=line,
                                 field="window_start_s/rate/shape", allowed="numbers") from None
            pattern = row[3].strip()
            if pattern not in PATTERNS:
                raise InputError(f"unknown pattern {pattern!r}", path=str(path), line=line, field="pattern",
                                 allowed="Gamma, Weibull, or empty (no traffic)")
            if not (math.isfinite(start) and start >= 0 and math.isfinite(rate) and rate >= 0):
                raise InputError(f"got {row[0]!r}, {row[1]!r}", path=str(path), line=line,
                                 field="window_start_s/rate", allowed="finite numbers >= 0")
            if pattern and rate > 0 and not (math.isfinite(shape) and shape > 0):
                raise InputError(f"got {row[4]!r}", path=str(path), line=line, field="shape", allowed="a number > 0")
            rows.append((start, rate, pattern if rate > 0 else "", shape))
    if not rows:
        raise InputError("no windows", path=str(path), allowed="ServeGen trace rows")
    return rows


def _distribution(text, path: Path, key: str, field: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The {tokens: probability} literal as (values, probabilities); None for "{}" (a window with
    no recorded requests)."""
    try:
        table = ast.literal_eval(text) if isinstance(text, str) else None
    except (ValueError, SyntaxError):
        table = None
    if table == {}:
        return None
    if not isinstance(table, dict):
        raise InputError("not a {tokens: probability} dict literal", path=str(path), field=f"{key}.{field}",
                         allowed="a string like '{45: 0.01, 46: 0.02}'")
    values = np.array(list(table.keys()), dtype=np.float64)
    weights = np.array(list(table.values()), dtype=np.float64)
    if (not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values != np.floor(values))
            or not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0):
        raise InputError("token counts must be integers >= 0 and probabilities >= 0 (not all 0)",
                         path=str(path), field=f"{key}.{field}", allowed="a {tokens: probability} dict")
    return values.astype(np.int64), weights / weights.sum()


def _dataset(path: Path) -> list[tuple[float, tuple, tuple]]:
    """(window start s, input distribution, output distribution), by start; windows with no
    recorded requests ("{}") are left out, so a request in one draws from the latest window before
    it that has data (the first one, before any)."""
    if not path.is_file():
        raise InputError("the client's dataset file is missing (it sits beside the trace CSV)", path=str(path))
    try:
        with open_text(path) as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc.msg})", path=str(path), line=exc.lineno) from None
    if not isinstance(data, dict) or not data:
        raise InputError("expected an object keyed by window start", path=str(path))
    out = []
    for key, value in data.items():
        try:
            start = float(key)
        except ValueError:
            raise InputError(f"window key {key!r}", path=str(path), field=key, allowed="a start time in s") from None
        if not isinstance(value, dict):
            raise InputError("expected an object", path=str(path), field=key, allowed="input_tokens, output_tokens")
        lengths = (_distribution(value.get("input_tokens"), path, key, "input_tokens"),
                   _distribution(value.get("output_tokens"), path, key, "output_tokens"))
        if None not in lengths:
            out.append((start, *lengths))
    if not out:
        raise InputError("no window has a length distribution (all are {})", path=str(path),
                         allowed="at least one window with input_tokens and output_tokens")
    return sorted(out, key=lambda x: x[0])


def _gaps(pattern: str, shape: float, rate: float, count: int, rng: np.random.Generator) -> np.ndarray:
    if pattern == "Gamma":
        return rng.gamma(shape, 1.0 / (rate * shape), count)
    return rng.weibull(shape, count) / (rate * math.gamma(1.0 + 1.0 / shape))  # mean scale * Γ(1 + 1/k)


def _client_times(rows, start_s: float, end_s: float, rng: np.random.Generator) -> np.ndarray:
    times = []
    for window_s, rate, pattern, shape in rows:
        lo, hi = max(window_s, start_s), min(window_s + WINDOW_S, end_s)
        if not pattern or hi <= lo:
            continue
        t, expected = lo, max(16, int(rate * (hi - lo) * 1.5) + 16)
        while t < hi:
            drawn = t + np.cumsum(_gaps(pattern, shape, rate, expected, rng))
            times.append(drawn[drawn < hi])
            t = float(drawn[-1])
    return np.concatenate(times) if times else np.empty(0)


def _client_files(path: Path, all_clients: bool) -> list[tuple[Path, Path]]:
    if _TRACE_NAME.search(path.name) is None:
        raise InputError("not a ServeGen trace file name", path=str(path), field="path",
                         allowed="chunk-<client>-trace.csv (its chunk-<client>-dataset.json beside it)")
    traces = [path]
    if all_clients:
        traces = sorted(path.parent.glob("chunk-*-trace.csv"), key=lambda p: int(_TRACE_NAME.search(p.name)[1]))
    return [(p, p.with_name(p.name.replace("-trace.csv", "-dataset.json"))) for p in traces]


@register_format("servegen", signatures=(), encodings=("csv",))
def load_servegen(path: Path, *, start_s: float = 0.0, duration_s: float = WINDOW_S, seed: int = 0,
                  all_clients: bool = False) -> Workload:
    """ServeGen client trace CSV (+ its dataset JSON): requests drawn over [start_s, start_s + duration_s)."""
    for name, value in (("start_s", start_s), ("duration_s", duration_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise InputError(f"got {value!r}", field=name, allowed="a finite number of seconds >= 0")
    if duration_s <= 0:
        raise InputError("got 0", field="duration_s", allowed="a number of seconds > 0")
    rng = np.random.default_rng(seed)
    arrivals, prompts, outputs = [], [], []
    for trace, dataset in _client_files(path, all_clients):
        rows, windows = _trace_rows(trace), _dataset(dataset)
        times = _client_times(rows, start_s, start_s + duration_s, rng)
        starts = np.array([w[0] for w in windows])
        which = np.maximum(np.searchsorted(starts, times, side="right") - 1, 0)
        p, o = np.zeros(len(times), dtype=np.int64), np.zeros(len(times), dtype=np.int64)
        for i, (_start, (in_v, in_p), (out_v, out_p)) in enumerate(windows):
            mask = which == i
            p[mask] = rng.choice(in_v, size=int(mask.sum()), p=in_p)
            o[mask] = rng.choice(out_v, size=int(mask.sum()), p=out_p)
        arrivals.append(times)
        prompts.append(p)
        outputs.append(o)
    times, p, o = np.concatenate(arrivals), np.concatenate(prompts), np.concatenate(outputs)
    keep = (p > 0) & (o > 0)  # a 0-token draw is no request to run
    order = np.argsort(times[keep], kind="stable")
    times, p, o = times[keep][order] - start_s, p[keep][order], o[keep][order]
    if len(times) == 0:
        raise InputError(f"no request in [{start_s:g}, {start_s + duration_s:g}) s", path=str(path),
                         field="start_s", allowed="a range where the client(s) send traffic")
    requests = [RequestSpec(f"servegen-{i}", float(t), int(a), int(b)) for i, (t, a, b) in enumerate(zip(times, p, o))]
    clients = "all clients" if all_clients else "client " + _TRACE_NAME.search(path.name)[1]
    return Workload(requests, name=path.parent.name + "-" + path.name.removesuffix(".csv"),
                    source=f"{path} ({clients}, {start_s:g}..{start_s + duration_s:g} s, seed {seed})",
                    attribution=ATTRIBUTION)
