"""Percentiles and medians by selection (simulator/order_stats.py) against numpy's own, bit for bit."""

import numpy as np
import pytest

from servesim.simulator.order_stats import (OrderStatistics, median_and_percentiles, median_from, percentile_ranks,
                                            percentiles, percentiles_from)

PS = (50, 90, 95, 99)
BENCH_PS = (50, 90, 99)


def _same(a: list[float], b: list[float]) -> None:
    """Equal as IEEE values, bit for bit (NaN equal to NaN, the sign of a zero included)."""
    assert np.array(a, dtype=np.float64).tobytes() == np.array(b, dtype=np.float64).tobytes(), (a, b)


def _datasets():
    rng = np.random.default_rng(43)
    yield np.array([0.25])  # n = 1
    yield np.array([3.0, 1.0])  # n = 2
    yield np.array([1.0, 1.0 + 2**-52, 1.0 + 2**-51])  # neighbouring doubles
    yield np.full(1000, 0.0125)  # all tied
    yield rng.exponential(0.02, 100_003)
    yield rng.integers(0, 5, 10_000).astype(np.float64) * 0.1  # heavy ties
    yield np.concatenate([np.zeros(500), rng.random(37)])  # zeros (spec decoding's same-step gaps)
    yield np.array([1e308, -1e308, 1e-308, 5e-324, 0.0, 2.0])  # extremes
    yield np.array([np.inf, 1.0, np.inf])  # an infinite maximum: numpy's interpolation gives NaN
    yield np.array([-np.inf, 0.5, 7.0, np.inf])
    for n in range(1, 40):  # every small size: each rank and weight case
        yield rng.normal(size=n) * 10.0 ** int(rng.integers(-6, 6))


@pytest.mark.parametrize("values", list(_datasets()), ids=lambda v: f"n{len(v)}")
def test_percentiles_and_median_match_numpy_bitwise(values):
    _same(percentiles(values, PS), np.percentile(values, PS).tolist())
    med, ps = median_and_percentiles(values, BENCH_PS)
    _same([med], [float(np.median(values))])
    _same(ps, np.percentile(values, BENCH_PS).tolist())
    _same(percentiles(values, (0, 12.5, 33.3, 100)), np.percentile(values, (0, 12.5, 33.3, 100)).tolist())


def test_own_partitions_in_place_and_copy_leaves_values_alone():
    values = np.random.default_rng(1).random(1001)
    before = values.copy()
    percentiles(values, PS)
    assert values.tobytes() == before.tobytes()
    expected = np.percentile(before, PS).tolist()
    _same(percentiles(values, PS, own=True), expected)  # reordered now; the figures are the same


def test_a_tail_of_the_selection_and_a_scale_give_the_scaled_tails_figures():
    """The positive gaps in ms from the partition of every gap in s (bench_serve's ITL)."""
    rng = np.random.default_rng(7)
    gaps = np.concatenate([np.zeros(300), rng.exponential(0.03, 5000)])
    rng.shuffle(gaps)
    ms = gaps[gaps > 0] * 1e3
    m = int((gaps <= 0).sum())
    n = len(gaps) - m
    ranks = [*percentile_ranks(len(gaps), PS), *(np.array(percentile_ranks(n, BENCH_PS)) + m).tolist(),
             m + n // 2 - 1, m + n // 2]
    stats = OrderStatistics(gaps, ranks)
    _same(percentiles_from(stats, PS), np.percentile(gaps, PS).tolist())
    _same(percentiles_from(stats, BENCH_PS, offset=m, n=n, scale=1e3), np.percentile(ms, BENCH_PS).tolist())
    _same([median_from(stats, offset=m, n=n, scale=1e3)], [float(np.median(ms))])


def test_refuses_nan_and_ranks_it_was_not_given():
    with pytest.raises(ValueError, match="NaN"):
        OrderStatistics(np.array([1.0, np.nan]), [0])
    with pytest.raises(ValueError, match="outside"):
        OrderStatistics(np.array([1.0, 2.0]), [2])
    stats = OrderStatistics(np.array([3.0, 1.0, 2.0]), [1])
    with pytest.raises(KeyError):
        stats.at(np.array([0]))


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 127, 128, 129, 1000, 8193, 100_003])
def test_mean_and_std_in_place_are_numpys_bit_for_bit(n):
    """The pairwise sums do not depend on where the values lie: views at odd offsets of a larger
    buffer give numpy's figures of a fresh copy."""
    from servesim.simulator.order_stats import mean_and_std

    rng = np.random.default_rng(n)
    for values in (rng.random(n) * 1e3, rng.exponential(8.0, n), np.round(rng.random(n) * 7, 2) + 1e-3):
        for offset in (0, 1, 3):
            buf = np.empty(n + offset + 2)
            view = buf[offset:offset + n]
            view[:] = values
            got = mean_and_std(view)
            assert got == (float(values.mean()), float(values.std()))
            assert repr(got) == repr((float(values.mean()), float(values.std())))


def test_mean_and_std_refuse_what_numpy_would_read_otherwise():
    from servesim.simulator.order_stats import mean_and_std

    for bad in (np.empty(0), np.arange(4), np.ones((2, 2)), np.ones(8)[::2]):
        with pytest.raises(ValueError):
            mean_and_std(bad)
