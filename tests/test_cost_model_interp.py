"""Interpolators behind the profiled model: exactness on the grid, clamping, extrapolation,
exact combination of curves, irregular nested grids and JSON round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.simulator.cost_model.interp import Curve, NestedGrid, mape


def test_curve_interpolates_clamps_and_extrapolates():
    c = Curve([1, 2, 4, 8], [10, 12, 16, 24])
    assert [c(x) for x in (1, 2, 3, 8)] == [10, 12, 14, 24]
    assert c(0.5) == 10  # never cheaper than the smallest measured launch
    assert c(16) == pytest.approx(24 + 2 * 8)  # slope over the upper half: (24-16)/(8-4)
    noisy = Curve([1, 2, 3], [5, 9, 4])  # a falling tail must not extrapolate downwards
    assert noisy(100) == 4


def test_curve_from_points_takes_medians_of_repeats():
    c = Curve.from_points(np.array([2, 1, 2, 2]), np.array([5.0, 1.0, 7.0, 100.0]))
    assert c.xs == [1, 2] and c.ys == [1, 7]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 1000), st.floats(0, 1)), min_size=1, max_size=8, unique_by=lambda p: round(p[0], 3)),
       st.lists(st.tuples(st.floats(1, 1000), st.floats(0, 1)), min_size=1, max_size=8, unique_by=lambda p: round(p[0], 3)),
       st.floats(0.5, 3000))
def test_combine_is_exact(a, b, x):
    ca = Curve(*zip(*sorted((round(p, 3), v) for p, v in a)))
    cb = Curve(*zip(*sorted((round(p, 3), v) for p, v in b)))
    both = Curve.combine([ca, cb], [2, 1])
    assert both(x) == pytest.approx(2 * ca(x) + cb(x), rel=1e-9, abs=1e-9)


def test_nested_grid_irregular_and_collapsed_axes():
    pts, ys = [], []
    for a in (0, 10, 20):  # axis a; b exists only when a > 0 (like prefix only with a chunk)
        for b in ((0,) if a == 0 else (0, 100)):
            for c in (1, 3):
                pts.append((a, b, c))
                ys.append(a + 0.1 * b + c)
    g = NestedGrid.from_points(["a", "b", "c"], np.array(pts), np.array(ys))
    for p, y in zip(pts, ys):
        assert g(*p) == pytest.approx(y)
    assert g(15, 50, 2) == pytest.approx(15 + 5 + 2)  # multilinear inside
    assert g(0, 999, 2) == pytest.approx(2)  # b collapsed where a == 0: ignored
    assert g(5, 0, 1) == pytest.approx(5 + 1)  # between the collapsed branch and a full one
    assert g(30, 0, 1) == pytest.approx(31)  # linear extrapolation on a
    again = NestedGrid.from_dict(json.loads(json.dumps(g.to_dict())))
    assert again(15, 50, 2) == g(15, 50, 2)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-5, 40), min_size=3, max_size=3), st.floats(-1, 10), st.floats(-1, 10))
def test_pair_equals_two_lookups(head, u, v):
    rng = np.random.default_rng(7)  # a fixed irregular grid with non-linear, partly falling data
    pts, ys = [], []
    for a in (0, 10, 20):
        for b in ((0,) if a == 0 else (0, 8, 30)):
            for c in (1, 4):
                for d in (0, 2, 5, 9):
                    pts.append((a, b, c, d))
                    ys.append(float(rng.uniform(0, 10)))
    g = NestedGrid.from_points(["a", "b", "c", "d"], np.array(pts), np.array(ys))
    a, b = g.pair(*head, u, v)
    assert a == pytest.approx(g(*head, u), rel=1e-12, abs=1e-12)
    assert b == pytest.approx(g(*head, v), rel=1e-12, abs=1e-12)


def test_mape():
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
