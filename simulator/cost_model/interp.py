"""Interpolators for measured latency tables: fast to evaluate, JSON-serialisable.

* :class:`Curve` -- piecewise-linear y(x) through measured points; clamps below the first point
  (a kernel never gets cheaper than its smallest measured launch) and extrapolates above the last
  with the slope over the upper half of the range (robust to one noisy final point).
* :class:`NestedGrid` -- multilinear interpolation over an *irregular nested* grid: each axis value
  may have its own set of values on the next axis (the LLMServingSim attention grid has no prefix
  axis when the chunk is 0, and no context axis when there are no decodes). An axis with a single
  value is collapsed: queries ignore that coordinate.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np


class Curve:
    __slots__ = ("xs", "ys", "tail_slope", "_slopes", "_n")

    def __init__(self, xs: Sequence[float], ys: Sequence[float], tail_slope: float | None = None):
        if len(xs) != len(ys) or not len(xs):
            raise ValueError("Curve needs matching, non-empty x and y")
        self.xs = [float(x) for x in xs]
        self.ys = [float(y) for y in ys]
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])):
            raise ValueError("Curve x values must be strictly increasing")
        self._n = len(self.xs)
        self._slopes = [(y1 - y0) / (x1 - x0) for x0, x1, y0, y1
                        in zip(self.xs, self.xs[1:], self.ys, self.ys[1:])]
        self.tail_slope = self._robust_tail() if tail_slope is None else float(tail_slope)

    def _robust_tail(self) -> float:
        if self._n == 1:
            return 0.0
        last = self.xs[-1]
        j = min(bisect_right(self.xs, last / 2), self._n - 2)
        return max(0.0, (self.ys[-1] - self.ys[j]) / (last - self.xs[j]))

    @classmethod
    def from_points(cls, x: np.ndarray, y: np.ndarray) -> "Curve":
        """Median of repeated x values, then a curve through the medians."""
        import pandas as pd  # fitting only: a replay never imports pandas

        med = pd.Series(np.asarray(y, dtype=float)).groupby(np.asarray(x, dtype=float)).median()
        return cls(med.index.to_numpy(), med.to_numpy())

    def __call__(self, x: float) -> float:
        i = bisect_right(self.xs, x)
        if i == 0:
            return self.ys[0]
        if i == self._n:
            return self.ys[-1] + self.tail_slope * (x - self.xs[-1])
        return self.ys[i - 1] + self._slopes[i - 1] * (x - self.xs[i - 1])

    @classmethod
    def combine(cls, curves: Sequence["Curve"], weights: Sequence[float]) -> "Curve":
        """The exact weighted sum of piecewise-linear curves, as one curve (one lookup, not many)."""
        xs = sorted({x for c in curves for x in c.xs})
        ys = [sum(w * c(x) for c, w in zip(curves, weights)) for x in xs]
        # Every curve is linear past its own last point, so past the union's last point the sum
        # is linear with the summed tail slopes: the combination is exact everywhere.
        tail = sum(w * c.tail_slope for c, w in zip(curves, weights))
        return cls(xs, ys, tail_slope=tail)

    def to_dict(self) -> dict:
        return {"x": self.xs, "y": self.ys, "tail_slope": self.tail_slope}

    @classmethod
    def from_dict(cls, d: dict) -> "Curve":
        return cls(d["x"], d["y"], d.get("tail_slope"))


class NestedGrid:
    """y(point) over axes ``a0, a1, ..., a_last``; the last axis is a :class:`Curve`."""

    __slots__ = ("axes", "root", "_depth")

    def __init__(self, axes: Sequence[str], root: tuple):
        self.axes = tuple(axes)
        self.root = root  # (xs, children) per level; Curve at the last level
        self._depth = len(self.axes) - 1

    @classmethod
    def from_points(cls, axes: Sequence[str], points: np.ndarray, y: np.ndarray) -> "NestedGrid":
        """Build from rows ``points[i] = (a0, ..., a_last)`` with latencies ``y[i]``."""
        points = np.asarray(points, dtype=float)
        y = np.asarray(y, dtype=float)
        if points.ndim != 2 or points.shape[1] != len(axes) or len(points) != len(y) or not len(y):
            raise ValueError("NestedGrid needs one coordinate column per axis and matching y")
        return cls(axes, cls._build(points, y))

    @classmethod
    def _build(cls, points: np.ndarray, y: np.ndarray) -> tuple | Curve:
        if points.shape[1] == 1:
            return Curve.from_points(points[:, 0], y)
        keys = points[:, 0]
        xs = np.unique(keys)
        children = tuple(cls._build(points[keys == v, 1:], y[keys == v]) for v in xs)
        return ([float(v) for v in xs], children)

    def __call__(self, *point: float) -> float:
        return self._eval(self.root, point, 0)

    def _eval(self, node, point, depth: int) -> float:
        if depth == self._depth:
            return node(point[depth])
        xs, kids = node
        lo, hi, num, den, beyond = _bracket(xs, point[depth])
        y0 = self._eval(kids[lo], point, depth + 1)
        if hi is None:
            return y0
        y1 = self._eval(kids[hi], point, depth + 1)
        return _blend(y0, y1, num, den, beyond)

    def pair(self, *point: float) -> tuple[float, float]:
        """``(y(a0, ..., a_last = u), y(a0, ..., a_last = v))`` for ``point = (a0, ..., u, v)``
        in one walk down the grid: the two queries share every axis but the last."""
        return self._eval_pair(self.root, point, 0)

    def _eval_pair(self, node, point, depth: int) -> tuple[float, float]:
        if depth == self._depth:
            return node(point[depth]), node(point[depth + 1])
        xs, kids = node
        lo, hi, num, den, beyond = _bracket(xs, point[depth])
        a0, b0 = self._eval_pair(kids[lo], point, depth + 1)
        if hi is None:
            return a0, b0
        a1, b1 = self._eval_pair(kids[hi], point, depth + 1)
        return _blend(a0, a1, num, den, beyond), _blend(b0, b1, num, den, beyond)

    def to_dict(self) -> dict:
        def enc(node, depth):
            if depth == self._depth:
                return node.to_dict()
            return {"x": node[0], "c": [enc(k, depth + 1) for k in node[1]]}
        return {"axes": list(self.axes), "tree": enc(self.root, 0)}

    @classmethod
    def from_dict(cls, d: dict) -> "NestedGrid":
        depth = len(d["axes"]) - 1

        def dec(node, level):
            if level == depth:
                return Curve.from_dict(node)
            return (list(node["x"]), tuple(dec(k, level + 1) for k in node["c"]))
        return cls(d["axes"], dec(d["tree"], 0))


def _bracket(xs: list[float], x: float) -> tuple[int, int | None, float, float, bool]:
    """Where ``x`` falls on one grid axis: ``(lower child, upper child, x - x0, x1 - x0, x > x1)``.

    The upper child is None when the lower one alone decides: a single-valued (collapsed) axis,
    below the first value (clamp), or exactly on a grid value (the other side has weight 0;
    e.g. no chunk, no prefix). Past the last value it is the last two (linear extrapolation).
    """
    n = len(xs)
    if n == 1:
        return 0, None, 0.0, 1.0, False
    i = bisect_right(xs, x)
    if i == 0:
        return 0, None, 0.0, 1.0, False
    if i == n:
        i -= 1
    x0, x1 = xs[i - 1], xs[i]
    if x == x0:
        return i - 1, None, 0.0, 1.0, False
    return i - 1, i, x - x0, x1 - x0, x > x1


def _blend(y0: float, y1: float, num: float, den: float, beyond: bool) -> float:
    # Past the last grid value extrapolation never goes below the last value.
    if beyond and y1 < y0:
        return y1
    return y0 + (y1 - y0) * num / den


def mape(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction (0.05 = 5 %)."""
    p = np.asarray(predicted, dtype=float)
    a = np.asarray(actual, dtype=float)
    return float(np.mean(np.abs(p - a) / a)) if len(a) else float("nan")
