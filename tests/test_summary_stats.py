"""Summary statistics of arrays nobody reads afterwards (scratch) are computed in place: the
figures must be the very floats of the copying path, and arrays not marked scratch must be left
as they were (metrics.stats, bench_metrics._stats)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.simulator.bench_metrics import _stats
from servesim.simulator.metrics import stats


def _samples():
    rng = np.random.default_rng(7)
    yield rng.lognormal(-4.0, 1.0, 10_001)
    yield rng.lognormal(-4.0, 1.0, 10_000)  # even: the median averages two middle values
    yield rng.lognormal(0.0, 6.0, 10_001)  # wide: its float sum depends on the order of the values
    with_nan = rng.lognormal(-4.0, 1.0, 5_000)
    with_nan[::7] = np.nan
    yield with_nan
    yield np.array([0.25])
    yield np.empty(0)


@pytest.mark.parametrize("values", list(_samples()), ids=["odd", "even", "wide", "nan", "one", "empty"])
def test_scratch_statistics_are_the_copying_path_floats(values):
    kept = values.copy()
    assert stats(values) == stats(values.copy(), scratch=True)
    assert _stats("itl", values, (50, 90, 99)) == _stats("itl", values.copy(), (50, 90, 99), scratch=True)
    np.testing.assert_array_equal(values, kept)  # not scratch: untouched
    mine = values.copy()
    stats(mine, scratch=True)
    assert sorted(mine[~np.isnan(mine)].tolist()) == sorted(kept[~np.isnan(kept)].tolist())


def test_a_series_or_list_is_never_reordered():
    import pandas as pd

    series = pd.Series([0.3, 0.1, 0.2, 0.5])
    assert stats(series, scratch=True) == stats([0.3, 0.1, 0.2, 0.5])
    assert series.tolist() == [0.3, 0.1, 0.2, 0.5]
