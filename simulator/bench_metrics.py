"""Benchmark-client metric semantics: what `vllm bench serve` and inference-perf would report.

Computed from `requests.parquet` (one row per request), so a simulated run and a measured one are
summarised by the same rules:

- completed / failed: a request is completed when it streamed its whole output; everything else a
  client sent (rejected by the server, timed out, cancelled) is failed, and is left out of every
  latency statistic, throughput and goodput, as `vllm bench serve` does;
- TTFT: first chunk received - request sent;
- TPOT: (E2E - TTFT) / (output tokens - 1), per request, excluding the first token;
- ITL: the gaps between consecutive *chunks* of a request (a chunk carrying several tokens, as with
  speculative decoding, is one gap), pooled over requests;
- E2EL: last chunk received - request sent;
- duration: first send to last completion; throughputs divide by it;
- goodput: completed requests meeting every given SLO (ms), per second.

Keys follow `vllm bench serve --save-result` (`mean_ttft_ms`, `p99_itl_ms`, `request_throughput`,
...); `inference_perf_stages` reports per load stage in inference-perf's vocabulary.

A requests table is a run's columns (simulator/columns.py) or a pandas DataFrame (a measured
run's requests.parquet): each column is read through numpy and rows are kept with a boolean mask,
which both answer alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.columns import Columns, notna
from servesim.simulator.order_stats import (OrderStatistics, mean_and_std, median_and_percentiles, median_from,
                                            median_ranks, percentile_ranks, percentiles_from)
from servesim.traces.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

BENCH_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS = ("ttft", "tpot", "e2el")
BENCH_PERCENTILES = (50, 90, 99)  # vllm bench serve's --metric-percentiles as the summary reports them


@dataclass(slots=True)
class GoodputSlo:
    """`--goodput ttft:500 tpot:50` (ms); None: that metric is not part of the SLO."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InputError(f"got {value!r}", field=f"--goodput {name[:-3]}", allowed="a number of ms > 0")

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))


def completed_mask(requests) -> np.ndarray:
    """Rows the client saw complete: status 'completed' (older frames: a finish with output)."""
    if "status" in requests.columns:
        return np.asarray(requests["status"]) == "completed"
    return notna(np.asarray(requests["finish_s"], dtype=float)) & (np.asarray(requests["output_len"]) > 0)


def per_request(requests) -> pd.DataFrame:
    """Completed requests with TTFT, TPOT, E2EL (ms) and their per-chunk ITLs (ms), bench rules."""
    import pandas as pd

    done = requests[completed_mask(requests)]
    rows = pd.DataFrame(_latencies(done))
    # Tokens of one chunk share a timestamp, so their per-token gaps are 0: one chunk, one gap.
    rows["itl_ms"] = [(g[g > 0] * 1e3).tolist() for g in (np.asarray(v, dtype=np.float64) for v in done["itl_s"])]
    return rows


def concat_gaps(table) -> tuple[np.ndarray, bool]:
    """A requests table's itl_s entries (float64 arrays, or [] where a request has no gap) laid end
    to end as one float64 array, in order, and whether that array is new (a scratch copy the
    caller may reorder): the table's own pooled buffer where it keeps one (Columns.flat: read-only,
    shared), else the rows concatenated."""
    flat = table.flat("itl_s") if isinstance(table, Columns) else None
    if flat is not None:
        return flat.values, False
    parts = [v for v in table["itl_s"] if len(v)]
    return (np.concatenate(parts).astype(np.float64, copy=False), True) if parts else (np.empty(0), True)


def _itl_ms(gaps: np.ndarray) -> np.ndarray:
    """Every completed request's per-chunk ITLs (ms) end to end, as per_request's lists laid out flat
    (the same products, in the same order), without a Python list per request; `gaps` is their
    gaps in seconds end to end (concat_gaps)."""
    positive = gaps[gaps > 0]  # a copy: scaled in place (the same products), one array less at once
    positive *= 1e3
    return positive


_COMPACT_CHUNK = 1 << 16  # gaps compacted at a time (ItlOrder.itl_ms)


class ItlOrder:
    """One partition of a gaps buffer (seconds, concat_gaps) answering both its own percentiles
    (the summary's itl_s) and bench_serve's ITL median and percentiles (ms, over the positive
    gaps): the positive gaps are the sorted tail past the others, and ms are the seconds times
    1e3, a monotone map (simulator/order_stats.py: the very values np.percentile and np.median
    give on each array). Built only for a buffer with a gap and no NaN (`of`). Its partitioned
    copy is kept as scratch, once its order statistics are read: bench_serve's ITL array (the
    positive gaps in ms) is built in it rather than in a new array (itl_ms)."""

    __slots__ = ("gaps", "mean_s", "percentiles_s", "percentiles_ms", "num_other", "stats", "_scratch")

    def __init__(self, gaps: np.ndarray, own: bool, percentiles_s: tuple[float, ...],
                 percentiles_ms: tuple[float, ...]) -> None:
        """`own`: gaps is a scratch array nobody reads afterwards (partitioned in place, not copied;
        no reader can then share it: `gaps` is kept only while it is intact)."""
        self.mean_s = float(gaps.mean())  # in the values' order: before any partition
        self.gaps = None if own else gaps
        self.percentiles_s = percentiles_s
        self.percentiles_ms = percentiles_ms
        self.num_other = len(gaps) - int(np.count_nonzero(gaps > 0))  # gaps of 0 (a chunk's tokens)
        num_positive = len(gaps) - self.num_other
        ranks = percentile_ranks(len(gaps), percentiles_s)
        if num_positive:
            ranks += [self.num_other + k for k in (*median_ranks(num_positive),
                                                   *percentile_ranks(num_positive, percentiles_ms))]
        part = gaps if own else gaps.copy()
        self.stats = OrderStatistics(part, ranks, own=True)  # (its values at the ranks kept: part is free)
        self._scratch: np.ndarray | None = None if own else part

    @staticmethod
    def of(gaps: np.ndarray, own: bool, percentiles_s: tuple[float, ...],
           percentiles_ms: tuple[float, ...] = BENCH_PERCENTILES) -> ItlOrder | None:
        """None where the buffer has no gap or a NaN (its readers then drop NaN and select alone)."""
        if gaps.dtype != np.float64 or gaps.ndim != 1 or gaps.size == 0 or bool(np.isnan(gaps).any()):
            return None
        return ItlOrder(gaps, own, percentiles_s, percentiles_ms)

    def seconds(self) -> list[float]:
        """np.percentile(gaps, percentiles_s).tolist()."""
        return percentiles_from(self.stats, self.percentiles_s)

    def itl_ms(self) -> np.ndarray:
        """_itl_ms(gaps) in the scratch buffer (once: it is then the caller's scratch)."""
        gaps, out = self.gaps, self._scratch
        if gaps is None or out is None:
            raise ValueError("the gaps were partitioned in place, or their scratch was handed out")
        self._scratch = None
        at = 0
        for a in range(0, len(gaps), _COMPACT_CHUNK):  # gaps[gaps > 0], a cache-sized chunk at a time:
            chunk = gaps[a:a + _COMPACT_CHUNK]  # (np.compress with `out` takes an index array and a
            kept = chunk[chunk > 0]  # copy of every value first)
            out[at:at + len(kept)] = kept
            at += len(kept)
        positive = out[:at]
        positive *= 1e3
        return positive

    def positive_ms(self) -> tuple[float, list[float]] | None:
        """(np.median, np.percentile at percentiles_ms) of _itl_ms(gaps); None: no positive gap."""
        n = self.stats.n - self.num_other
        if not n:
            return None
        return (median_from(self.stats, self.num_other, n, 1e3),
                percentiles_from(self.stats, self.percentiles_ms, self.num_other, n, 1e3))


def _latencies(done) -> dict[str, np.ndarray]:
    ttft = (np.asarray(done["first_token_s"], dtype=float) - np.asarray(done["arrival_s"], dtype=float)) * 1e3
    e2el = (np.asarray(done["finish_s"], dtype=float) - np.asarray(done["arrival_s"], dtype=float)) * 1e3
    n_out = np.asarray(done["output_len"])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n_out > 1, (e2el - ttft) / np.maximum(n_out - 1, 1), np.nan)
    return {"request_id": np.asarray(done["request_id"]), "arrival_s": np.asarray(done["arrival_s"], dtype=float),
            "prompt_len": np.asarray(done["prompt_len"]), "output_len": n_out,
            "ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el}


def _stats(name: str, values: np.ndarray, percentiles: tuple[float, ...], scratch: bool = False,
           selected: tuple[float, list[float]] | None = None) -> dict[str, float | None]:
    """scratch: `values` is an array nobody reads afterwards (_itl_ms' result): the median and
    percentiles reorder it in place rather than partitioning copies. Mean and std are taken first,
    in the values' order; the others are order statistics, the same in any order. `selected`: the
    median and percentiles already found (ItlOrder.positive_ms: values has no NaN)."""
    nan = np.isnan(values)
    if nan.any():  # filtered only when there is something to drop: a cluster hour has ~65 M ITLs
        values = values[~nan]
        scratch = True
    out: dict[str, float | None] = {}
    empty = values.size == 0
    if selected is not None and scratch and not empty:  # the values are read for nothing else
        mean, std = mean_and_std(values)
    else:
        mean = None if empty else float(values.mean())
        std = None if empty else float(values.std())
    # the median and every percentile from one selection (each value numpy's own: order_stats.py)
    if empty:
        median, found = None, [None] * len(percentiles)
    else:
        median, found = selected if selected is not None else median_and_percentiles(values, percentiles, own=scratch)
    out[f"mean_{name}_ms"] = mean
    out[f"median_{name}_ms"] = median
    out[f"std_{name}_ms"] = std
    for p, value in zip(percentiles, found):
        out[f"p{p:g}_{name}_ms"] = value
    return out


def bench_serve_result(requests, slo: GoodputSlo | None = None, percentiles: tuple[float, ...] = BENCH_PERCENTILES,
                       itl_order: ItlOrder | None = None) -> dict[str, float | int | None]:
    """The figures `vllm bench serve --save-result` would write for this run. `itl_order`: a
    partition of the gaps already taken (the summary's), used where it is of this run's completed
    requests' very gaps buffer at these percentiles."""
    done = requests[completed_mask(requests)]
    rows = _latencies(done)
    completed = len(rows["ttft_ms"])
    sent = np.asarray(requests["arrival_s"], dtype=float)
    duration = 0.0
    if completed:  # first send to last completion
        end = float((rows["arrival_s"] + rows["e2el_ms"] / 1e3).max())
        duration = max(end - float(sent.min()), 1e-12)
    total_in, total_out = int(rows["prompt_len"].sum()), int(rows["output_len"].sum())
    result: dict[str, float | int | None] = {
        "duration": duration, "completed": completed, "failed": int(len(requests) - completed),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": completed / duration if duration else 0.0,
        "request_goodput": None,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
    }
    if slo is not None and slo.is_set and completed:
        good = np.ones(completed, dtype=bool)
        for metric in SLO_METRICS:
            limit = getattr(slo, f"{metric}_ms")
            if limit is not None:
                good &= np.nan_to_num(rows[f"{metric}_ms"], nan=0.0) <= limit
        result["request_goodput"] = int(good.sum()) / duration
    gaps, _ = concat_gaps(done)
    shared = itl_order if itl_order is not None and itl_order.gaps is not None and itl_order.gaps is gaps and \
        tuple(itl_order.percentiles_ms) == tuple(percentiles) else None
    itl = _itl_ms(gaps) if shared is None else shared.itl_ms()
    del gaps
    for metric in BENCH_METRICS:
        values = itl if metric == "itl" else np.asarray(rows[f"{metric}_ms"], dtype=float)
        result.update(_stats(metric, values, percentiles, scratch=metric == "itl",
                             selected=shared.positive_ms() if shared is not None and metric == "itl" else None))
    return result


def inference_perf_stages(requests, stage_bounds_s: list[tuple[float, float]],
                          percentiles: tuple[float, ...] = (50, 90, 99)) -> list[dict]:
    """Per load stage (requests *sent* in [start, end)), inference-perf's figures (ms)."""
    out = []
    for i, (start, end) in enumerate(stage_bounds_s):
        sent = np.asarray(requests["arrival_s"], dtype=float)
        stage = requests[(sent >= start) & (sent < end)]
        res = bench_serve_result(stage, None, percentiles)
        out.append({"stage": i, "start_s": start, "end_s": end, "completed": res["completed"],
                     "failed": res["failed"],
                     **{k.replace("e2el", "request_latency").replace("itl", "inter_token_latency")
                        .replace("ttft", "time_to_first_token").replace("tpot", "time_per_output_token"): v
                        for k, v in res.items() if k.endswith("_ms")}})
    return out
