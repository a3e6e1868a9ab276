"""The requests table (REQUEST_COLUMNS) from a run's request records, a chunk of rows at a time:
each request's inter-token gaps pooled into one buffer, then the columns of its rows
(MetricsCollector.request_columns in simulator/metrics.py calls these, and may let the records of a
chunk go once its rows are built).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from servesim.simulator.columns import FlatList, float_column
from servesim.simulator.request_records import RequestRecord


def pooled_gaps(records: list[RequestRecord]) -> FlatList:
    """Every request's inter-token gaps laid end to end (request order), with each request's
    offsets: per chunk of requests (POOL_CHUNK_TOKENS times each), their token times laid end to
    end in one copy, then each gap the same subtraction np.diff per request makes (gather_gaps).
    Converting each request's times to an array separately cost more than the whole rest of the
    frame; the chunks bound the temporaries, so pooling a day of a fleet's ~10^8-10^9 tokens holds
    the result and a chunk, not every token twice.

    Read-only: each request's itl_s is a view of it (FlatList.row_list; 8 bytes a gap: as lists of floats
    a cluster hour's 65 M gaps took ~2 GB per frame), and the summary's statistics and
    requests.parquet's list column read the buffer itself."""
    lens = np.fromiter((len(r.token_times_s) for r in records), dtype=np.int64, count=len(records))
    num_gaps = np.maximum(lens - 1, 0)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(num_gaps, out=offsets[1:])
    gaps = np.empty(int(offsets[-1]))
    ends = np.cumsum(lens)
    a = 0
    while a < len(lens):
        # the requests [a, b): at least one, at most POOL_CHUNK_TOKENS times unless one request has more
        b = max(int(np.searchsorted(ends, ends[a] - lens[a] + POOL_CHUNK_TOKENS, side="right")), a + 1)
        # a chunk's arrays laid end to end in one copy (bytes.join reads each array's buffer: no numpy
        # view per request, ~3x faster than concatenating views on the Azure hour's 19 k)
        times = np.frombuffer(b"".join([r.token_times_s for r in records[a:b]]), dtype=np.float64)
        fill_gaps(times, ends[a:b] - lens[a:b] - (ends[a] - lens[a]), offsets[a:b + 1] - offsets[a],
                  gaps[offsets[a]:offsets[b]])
        a = b
    gaps.flags.writeable = False
    return FlatList(gaps, offsets)


def gather_gaps(times: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> FlatList:
    """pooled_gaps of rows whose token times lie anywhere in one buffer: row r's are
    times[starts[r]:starts[r] + lens[r]] (a row's times contiguous, the rows in any order)."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(np.maximum(lens - 1, 0), out=offsets[1:])
    gaps = np.empty(int(offsets[-1]))
    fill_gaps(times, starts, offsets, gaps)
    gaps.flags.writeable = False
    return FlatList(gaps, offsets)


POOL_CHUNK_TOKENS = 1 << 22  # token times pooled at a time (32 MB of them)
GAP_CHUNK = 1 << 16  # gaps computed at a time: the index temporaries stay cache-sized and are reused


def fill_gaps(times: np.ndarray, starts: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    """Rows' gaps into `out` (exactly their number, row after row): row r's times start at
    times[starts[r]] and its offsets[r + 1] - offsets[r] gaps go to out[offsets[r]:offsets[r + 1]]
    (offsets from 0), each times[j + 1] - times[j]: the subtraction np.diff of the row makes.
    Rows are taken a chunk of GAP_CHUNK gaps at a time (a row with more, alone): each gap's first
    time is found by index (no copy of the times, no mask over them)."""
    num_rows = len(starts)
    steps = np.arange(min(GAP_CHUNK, len(out)), dtype=np.int64)
    a = 0
    while a < num_rows:
        # rows [a, b): offsets[b] - offsets[a] <= GAP_CHUNK, or the one row a alone
        b = max(int(np.searchsorted(offsets, offsets[a] + GAP_CHUNK, side="right")) - 1, a + 1)
        b = min(b, num_rows)
        lo, hi = int(offsets[a]), int(offsets[b])
        if hi > lo:
            counts = np.diff(offsets[a:b + 1])
            first = np.repeat(starts[a:b] - (offsets[a:b] - lo), counts)  # row's start less its first gap's place
            first += steps[:hi - lo] if hi - lo <= len(steps) else np.arange(hi - lo, dtype=np.int64)
            np.subtract(times[first + 1], times[first], out=out[lo:hi])
        a = b


def append_row(cols: dict[str, list], r: RequestRecord, itl: np.ndarray | list) -> None:
    """One request's values onto the requests-frame columns (completed, rejected or timed out);
    `itl` is its inter-token gaps (FlatList.row_list)."""
    times = r.token_times_s
    n = len(times)
    if r.status == "timed_out" or r.reject_reason is not None:
        # Latencies stay empty (NaN) so the request never counts in a percentile or CDF; a timed-out
        # request keeps what it streamed (output_len, first_scheduled_s), a failure as vllm bench counts.
        # A request aborted as stranded (status "aborted") keeps what it streamed as a timed-out one does.
        ran = r.status in ("timed_out", "aborted")
        values = dict.fromkeys(_LATENCY_COLUMNS, math.nan)
        values.update(request_id=r.request_id, arrival_s=r.arrival_s, prompt_len=r.prompt_len,
                      output_len=n if ran else 0, output_len_target=r.output_len_target, itl_s=[],
                      num_preemptions=r.num_preemptions, num_cached_tokens=r.num_cached_tokens if ran else 0,
                      finish_reason="abort" if ran else None, status=r.status if ran else "rejected",
                      reject_reason=None if r.status == "timed_out" else r.reject_reason,
                      grammar_wait_s=r.grammar_wait_s, input_wait_s=r.input_wait_s)
        if ran:
            values.update(first_scheduled_s=r.first_scheduled_s, queueing_s=_sub(r.first_scheduled_s, r.arrival_s))
    else:
        values = {
            "request_id": r.request_id, "arrival_s": r.arrival_s, "prompt_len": r.prompt_len,
            "output_len": n, "output_len_target": r.output_len_target,
            "first_scheduled_s": r.first_scheduled_s, "first_token_s": r.first_token_s, "finish_s": r.finish_s,
            "queueing_s": _sub(r.first_scheduled_s, r.arrival_s), "ttft_s": _sub(r.first_token_s, r.arrival_s),
            "tpot_s": (times[-1] - times[0]) / (n - 1) if n > 1 else None, "e2e_s": _sub(r.finish_s, r.arrival_s),
            "itl_s": itl,
            "num_preemptions": r.num_preemptions, "num_cached_tokens": r.num_cached_tokens,
            "finish_reason": r.finish_reason, "status": "completed" if r.finish_reason is not None else None,
            "reject_reason": None, "grammar_wait_s": r.grammar_wait_s, "input_wait_s": r.input_wait_s,
        }
    for c, v in values.items():
        cols[c].append(v)


def request_part(records: list[RequestRecord], itls: list | None, by_row: bool) -> tuple[dict, list[str]]:
    """Some requests' rows of the requests table as columns, and the float columns all missing
    in them (request_columns); `itls` each request's gaps (None: no itl_s column, the table's
    flat buffer holds it), `by_row`: some request of the run timed out or was rejected (the row
    path, append_row)."""
    lazy_gaps = itls is None
    if itls is None:
        itls = [[]] * len(records)  # (not read: the column is dropped below)
    if by_row:
        rows: dict[str, list] = {c: [] for c in REQUEST_COLUMNS}
        for r, itl in zip(records, itls):
            append_row(rows, r, itl)
        column: Callable[[str], list] = rows.pop  # each list dropped once converted
        pending: dict = rows
    else:  # every request completed (or is still running): one comprehension per column, when asked
        built = pending = completed_columns(records, itls)

        def column(name: str) -> list:
            return built.pop(name)()
    data: dict[str, np.ndarray | list] = {}
    all_none: list[str] = []
    for name in REQUEST_COLUMNS:
        kind = REQUEST_KINDS.get(name)
        event = SINCE_ARRIVAL.get(name)
        if name == "itl_s" and lazy_gaps:
            pending.pop(name, None)
        elif event is not None:  # every row's event time less its arrival: NaN where the event is
            pending.pop(name, None)  # missing (as _sub's None), missing everywhere where it is
            data[name] = data[event] - data["arrival_s"]
            if event in all_none:
                all_none.append(name)
        elif kind == "f":
            data[name], missing = float_column(column(name))
            if missing:
                all_none.append(name)
        elif kind == "i":
            data[name] = np.array(column(name), dtype=np.int64)
        else:
            data[name] = column(name)
    return data, all_none


class JoinedRows:
    """Consecutive row chunks' columns laid into one table's as they come: each chunk's arrays are
    copied into the table's (allocated whole at the first chunk) and dropped, so the chunks are
    never all in memory beside the table; a float column is all missing where it is in every chunk
    (as float_column says of the whole)."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.data: dict[str, np.ndarray | list] = {}
        self.all_none: set[str] | None = None
        self._at = 0

    def add(self, part: tuple[dict, list[str]]) -> None:
        data, all_none = part
        num = 0
        for name, values in data.items():
            num = len(values)
            if isinstance(values, np.ndarray):
                out = self.data.get(name)
                if out is None:
                    out = self.data[name] = np.empty(self.num_rows, dtype=values.dtype)
                out[self._at:self._at + num] = values
            else:
                self.data.setdefault(name, []).extend(values)
        self._at += num
        self.all_none = set(all_none) if self.all_none is None else self.all_none & set(all_none)


def completed_columns(records: list[RequestRecord], itls: list) -> dict[str, Callable[[], list]]:
    """The requests-frame columns when no request timed out or was rejected, each built when called:
    the very values append_row's completed branch appends (those since arrival are taken from the
    columns: SINCE_ARRIVAL). request_columns converts each to its
    array before building the next, so one column's Python objects exist at a time (1 M requests:
    ~30 MB a column of floats, not ~600 MB for all of them)."""
    n_out = [len(r.token_times_s) for r in records]
    return {
        "request_id": lambda: [r.request_id for r in records], "arrival_s": lambda: [r.arrival_s for r in records],
        "prompt_len": lambda: [r.prompt_len for r in records], "output_len": lambda: n_out,
        "output_len_target": lambda: [r.output_len_target for r in records],
        "first_scheduled_s": lambda: [r.first_scheduled_s for r in records],
        "first_token_s": lambda: [r.first_token_s for r in records], "finish_s": lambda: [r.finish_s for r in records],
        "tpot_s": lambda: [(r.token_times_s[-1] - r.token_times_s[0]) / (n - 1) if n > 1 else None
                           for r, n in zip(records, n_out)],
        "itl_s": lambda: itls,
        "num_preemptions": lambda: [r.num_preemptions for r in records],
        "num_cached_tokens": lambda: [r.num_cached_tokens for r in records],
        "finish_reason": lambda: [r.finish_reason for r in records],
        "status": lambda: ["completed" if r.finish_reason is not None else None for r in records],
        "reject_reason": lambda: [None] * len(records),
        "grammar_wait_s": lambda: [r.grammar_wait_s for r in records],
        "input_wait_s": lambda: [r.input_wait_s for r in records],
    }


REQUEST_COLUMNS = ["request_id", "arrival_s", "prompt_len", "output_len", "output_len_target", "first_scheduled_s",
                   "first_token_s", "finish_s", "queueing_s", "ttft_s", "tpot_s", "e2e_s", "itl_s",
                   "num_preemptions", "num_cached_tokens", "finish_reason", "status", "reject_reason",
                   "grammar_wait_s", "input_wait_s"]
# How request_columns stores each column: "f" float64 (NaN where missing), "i" int64; the rest as lists.
REQUEST_KINDS = {"arrival_s": "f", "prompt_len": "i", "output_len": "i", "output_len_target": "i",
                  "first_scheduled_s": "f", "first_token_s": "f", "finish_s": "f", "queueing_s": "f",
                  "ttft_s": "f", "tpot_s": "f", "e2e_s": "f", "num_preemptions": "i", "num_cached_tokens": "i",
                  "grammar_wait_s": "f", "input_wait_s": "f"}
# Columns that are an event's time less the arrival, by the event's column: computed on the
# columns (the same float64 subtraction per row as _sub, NaN where the event is missing), after both.
SINCE_ARRIVAL = {"queueing_s": "first_scheduled_s", "ttft_s": "first_token_s", "e2e_s": "finish_s"}
# Latency fields a rejected request leaves empty (NaN), so it never counts in a percentile or CDF.
_LATENCY_COLUMNS = ("first_scheduled_s", "first_token_s", "finish_s", "queueing_s", "ttft_s", "tpot_s", "e2e_s")


def _sub(a: float | None, b: float) -> float | None:
    return None if a is None else a - b


def mark_pool_aborts(records: list[RequestRecord]) -> None:
    """A request SGLang aborted on its own (finish "abort", not timed out, no reason): one that
    cannot decode even alone in the pool, a rejection of reason "exceeds_kv_pool"."""
    for r in records:
        if r.finish_reason == "abort" and r.reject_reason is None and r.status != "timed_out":
            r.reject_reason = "exceeds_kv_pool"
