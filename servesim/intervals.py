"""The interval maths of replicates, in one place: intervals over N replicate values of a metric,
the test of whether two configurations differ beyond noise, and the probability of meeting an SLO.

Each replicate is one independent draw of the run (its own seed, its own cost-model perturbation), so a
metric's N replicate values are treated as an i.i.d. sample. With mean m and sample standard deviation
s (n - 1 in the denominator):

* confidence interval of the mean (`ci_low`, `ci_high`, 95 %): m -/+ t(0.975, n-1) * s / sqrt(n),
  Student's t-interval: where the expected value of the metric lies; it shrinks as 1/sqrt(n).
* prediction interval (`pi_low`, `pi_high`, 90 %): m -/+ t(0.95, n-1) * s * sqrt(1 + 1/n): where one
  more draw (such as the real run) falls; it does not shrink to zero with n. Coverage on the real runs
  (docs/FIDELITY.md) is measured on this interval.
* `differ` (compare): Welch's t-test on two sets of replicates, at 5 %: the difference of the means
  beyond noise when the 95 % interval of the difference excludes 0.
* `probability_meeting` (plan): the fraction of replicates that meet the SLO, with a 90 % Wilson
  score interval on it.

Student's t quantiles come from the regularized incomplete beta function (continued fraction,
Lentz's method) inverted by bisection: no SciPy dependency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

CI_LEVEL = 0.95  # confidence of the interval on the mean
PI_LEVEL = 0.90  # coverage of the prediction interval (the "predicted 90 % interval" of the issue)
TEST_LEVEL = 0.05  # compare: significance of the difference between two configurations


@dataclass(slots=True, frozen=True)
class Interval:
    """A metric over n replicates: mean, sample sd, the CI of the mean and the prediction interval."""

    num_replicates: int
    mean: float
    sd: float
    ci_low: float
    ci_high: float
    pi_low: float
    pi_high: float

    def as_dict(self) -> dict:
        return {"mean": self.mean, "sd": self.sd, "ci_low": self.ci_low, "ci_high": self.ci_high,
                "pi_low": self.pi_low, "pi_high": self.pi_high, "num_replicates": self.num_replicates}


def interval(values: list[float], ci_level: float = CI_LEVEL, pi_level: float = PI_LEVEL) -> Interval:
    """The interval of one metric's replicate values (at least one; one value: zero width)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(1, mean, 0.0, mean, mean, mean, mean)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half_ci = t_quantile(0.5 + ci_level / 2, n - 1) * sd / math.sqrt(n)
    half_pi = t_quantile(0.5 + pi_level / 2, n - 1) * sd * math.sqrt(1 + 1 / n)
    return Interval(n, mean, sd, mean - half_ci, mean + half_ci, mean - half_pi, mean + half_pi)


@dataclass(slots=True, frozen=True)
class Difference:
    """b - a over two sets of replicates (Welch): the difference, its 95 % interval, and whether it
    is beyond noise (the interval excludes 0)."""

    diff: float
    low: float
    high: float
    beyond_noise: bool


def differ(a: list[float], b: list[float], level: float = 1 - TEST_LEVEL) -> Difference:
    """Welch's two-sample t-interval on the difference of the means (each side >= 2 replicates;
    two constant sides differ when their values do)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError("Welch's test needs at least two replicates on each side")
    ia, ib = interval(a), interval(b)
    diff = ib.mean - ia.mean
    va, vb = ia.sd ** 2 / na, ib.sd ** 2 / nb
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, diff, diff, diff != 0)
    dof = (va + vb) ** 2 / ((va * va / (na - 1) if va else 0.0) + (vb * vb / (nb - 1) if vb else 0.0))
    half = t_quantile(0.5 + level / 2, dof) * se
    return Difference(diff, diff - half, diff + half, not (diff - half <= 0 <= diff + half))


def probability_meeting(meets: list[bool], level: float = PI_LEVEL) -> tuple[float, float, float]:
    """(fraction of replicates meeting, Wilson score interval low, high) at ``level``."""
    n = len(meets)
    if n == 0:
        raise ValueError("no replicates")
    p = sum(meets) / n
    z = normal_quantile(0.5 + level / 2)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, max(0.0, centre - half), min(1.0, centre + half)


# --- distributions ----------------------------------------------------------------------------------

def normal_quantile(p: float) -> float:
    """The standard normal quantile, by bisection on erf (exact to ~1e-12)."""
    return _bisect(lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2))), p, -40.0, 40.0)


@lru_cache(maxsize=256)  # a replicate set asks the same (p, n - 1) for every metric
def t_quantile(p: float, dof: float) -> float:
    """Student's t quantile with ``dof`` > 0 degrees of freedom (p in (0, 1))."""
    if not 0 < p < 1 or not dof > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and dof > 0, got {p}, {dof}")
    if p == 0.5:
        return 0.0
    return _bisect(lambda x: t_cdf(x, dof), p, -1e6, 1e6)


def t_cdf(x: float, dof: float) -> float:
    """P(T <= x) for Student's t: I_{dof/(dof+x^2)}(dof/2, 1/2) / 2 in the tail."""
    tail = 0.5 * _betainc(dof / 2, 0.5, dof / (dof + x * x))
    return 1 - tail if x > 0 else tail


def _bisect(cdf, p: float, lo: float, hi: float) -> float:
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):  # the continued fraction converges fast on this side
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1 - math.exp(log_front) * _beta_cf(b, a, 1 - x) / b


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
