"""Percentiles and medians by selection: every order statistic a summary needs from one partition
of one buffer, with the very values np.percentile (method "linear") and np.median return.

Why: after a run the summary takes percentiles of every inter-token gap twice (summary.json's
`itl_s` in seconds; `bench_serve`'s ITL in ms over the positive gaps, median apart), and each
np.percentile / np.median call partitions its own copy at its own ranks. Here the ranks of every
figure are gathered first and one copy is partitioned at all of them (np.partition with every kth
at once); the figures are then read off it and interpolated with numpy's own formula.

Exactness (tests/test_order_stats.py compares against numpy on random, tied and adversarial data):
- an order statistic is a value, the same whichever partition found it (up to the sign of a zero:
  -0.0 and 0.0 tie, and numpy may return either; run data holds no -0.0);
- np.percentile's linear method reads the order statistics at floor(v) and floor(v) + 1 of the
  virtual index v = (n - 1) * (p / 100) (both clipped to n - 1) and interpolates with
  numpy's _lerp: a + (b - a) * g, or b - (b - a) * (1 - g) where g >= 0.5, g = v - floor(v);
  `_lerp` below is that formula in the same float64 operations;
- np.median is the middle order statistic (odd n) or np.mean of the two middle ones (even n:
  computed here by np.mean on those two values, as np.median does);
- a monotone map (x -> x * 1e3, ms from s) commutes with order statistics: the k-th smallest of
  the scaled values is the k-th smallest value scaled, so the positive gaps' statistics in ms are
  read off the partition of the gaps in seconds (the positive gaps are the sorted tail past the
  gaps that are not > 0).
NaN: callers drop NaN first (as the summary always did); `OrderStatistics` refuses an array with
NaN (it would sort last and shift every rank).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def virtual_ranks(n: int, percentiles: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower rank, upper rank, weight g) of each percentile of n values, as np.percentile's linear
    method computes them: v = (n - 1) * (p / 100); ranks floor(v) and floor(v) + 1, both the last
    rank where v >= n - 1 (numpy marks those -1, and takes g = v - (-1) against that mark: the
    two values are then the same and g only matters to an infinite one, which it turns to NaN as
    numpy does)."""
    q = np.true_divide(np.asarray(percentiles, dtype=np.float64), 100)
    v = (n - 1) * q
    lower = np.floor(v)
    upper = lower + 1
    top = v >= n - 1
    lower[top] = -1
    upper[top] = -1
    gamma = v - lower
    last = np.intp(n - 1)
    lower_rank, upper_rank = lower.astype(np.intp), upper.astype(np.intp)
    lower_rank[top] = last
    upper_rank[top] = last
    return lower_rank, upper_rank, gamma


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's linear interpolation (numpy.lib._function_base_impl._lerp), the same operations."""
    diff_b_a = b - a
    out = np.add(a, diff_b_a * t)
    np.subtract(b, diff_b_a * (1 - t), out=out, where=t >= 0.5)
    return out


def median_ranks(n: int) -> list[int]:
    """The ranks np.median reads of n values: the middle one (odd n) or the middle two."""
    half = n // 2
    return [half - 1, half] if n % 2 == 0 else [half]


class OrderStatistics:
    """One partitioned copy of a NaN-free buffer, answering order statistics at the ranks given
    up front (every figure's ranks gathered first: one np.partition for all of them)."""

    def __init__(self, values: np.ndarray, ranks: Sequence[int], own: bool = False) -> None:
        """`own`: values is a scratch array nobody reads afterwards (partitioned in place, not copied)."""
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError("order statistics of a one-dimensional buffer")
        if np.isnan(arr).any():
            raise ValueError("order statistics of a buffer with NaN (drop NaN first)")
        self.n = int(arr.size)
        wanted = sorted({int(k) for k in ranks})
        if wanted and not (0 <= wanted[0] and wanted[-1] < self.n):
            raise ValueError(f"ranks {wanted[0]}..{wanted[-1]} outside 0..{self.n - 1}")
        if own and arr is values and arr.flags.writeable:
            part = arr
        else:
            part = arr.copy()
        if wanted:
            part.partition(wanted)
        self._values = {k: part[k] for k in wanted}  # numpy float64 scalars: exact, cheap to keep
        del part

    def at(self, ranks: np.ndarray, scale: float | None = None) -> np.ndarray:
        """The order statistics at `ranks` (each among the ranks given), times `scale` if given
        (elementwise, as the scaled buffer's own order statistics: see the module docstring)."""
        out = np.array([self._values[int(k)] for k in ranks], dtype=np.float64)
        return out if scale is None else out * scale


def percentile_ranks(n: int, percentiles: Sequence[float]) -> list[int]:
    """Every rank `percentiles_from` reads for these percentiles of n values (n >= 1)."""
    lower, upper, _ = virtual_ranks(n, percentiles)
    return [*lower.tolist(), *upper.tolist()]


def percentiles_from(stats: OrderStatistics, percentiles: Sequence[float], offset: int = 0,
                     n: int | None = None, scale: float | None = None) -> list[float]:
    """np.percentile(x, percentiles).tolist() where x is the n values of ranks offset..offset+n-1
    of `stats`' buffer (all of it by default), scaled by `scale` if given; n >= 1."""
    n = stats.n - offset if n is None else n
    lower, upper, gamma = virtual_ranks(n, percentiles)
    return _lerp(stats.at(lower + offset, scale), stats.at(upper + offset, scale), gamma).tolist()


def median_from(stats: OrderStatistics, offset: int = 0, n: int | None = None, scale: float | None = None) -> float:
    """np.median(x) of the same values as percentiles_from reads; n >= 1."""
    n = stats.n - offset if n is None else n
    ranks = np.asarray(median_ranks(n)) + offset
    middle = stats.at(ranks, scale)
    return float(middle[0]) if len(middle) == 1 else float(np.mean(middle))


def percentiles(values: np.ndarray, ps: Sequence[float], own: bool = False) -> list[float]:
    """np.percentile(values, ps).tolist() for a NaN-free, non-empty buffer, by one selection."""
    stats = OrderStatistics(values, percentile_ranks(len(values), ps), own=own)
    return percentiles_from(stats, ps)


def median_and_percentiles(values: np.ndarray, ps: Sequence[float], own: bool = False) -> tuple[float, list[float]]:
    """(np.median(values), np.percentile(values, ps).tolist()) from one selection (NaN-free, non-empty)."""
    n = len(values)
    stats = OrderStatistics(values, [*median_ranks(n), *percentile_ranks(n, ps)], own=own)
    return median_from(stats), percentiles_from(stats, ps) if len(ps) else []


def mean_and_std(values: np.ndarray) -> tuple[float, float]:
    """(float(values.mean()), float(values.std())) of a non-empty float64 scratch array, which is
    overwritten: np.std's own operations (numpy's _var) with its deviations squared in the array
    itself instead of a new one of its size (a 32 MB temporary on the Azure hour's 4 M gaps, most
    of whose cost was the first touch of its pages). Each step is the one numpy takes on a copy of
    the same contiguous values: the pairwise sum of the values (kept as a one-element array, as
    _var keeps it) divided by their count, each value less that mean, squared, the pairwise sum of
    those divided by the count, its square root (tests/test_order_stats.py: bit for bit)."""
    if values.dtype != np.float64 or values.ndim != 1 or values.size == 0 or not values.flags.c_contiguous:
        raise ValueError("mean_and_std of a non-empty, contiguous, one-dimensional float64 array")
    mean = float(values.mean())  # before the values change
    count = np.intp(values.size)
    arrmean = np.add.reduce(values, keepdims=True)
    np.true_divide(arrmean, count, out=arrmean, casting="unsafe")
    np.subtract(values, arrmean, out=values)
    np.square(values, out=values)
    total = np.add.reduce(values)
    variance = total.dtype.type(total / np.maximum(count, 0))
    return mean, float(variance.dtype.type(np.sqrt(variance)))
