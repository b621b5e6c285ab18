"""Tests of the FMT numerical bound against independent computations: a full sum over clone
counts and outcomes, a block-walking upper bound, and an mpmath sum."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from privacy import accounting as acc


class FullSumFmt:
    """Straightforward FMT reduction: every clone count c and every outcome x, both directions,
    no window, no monotonicity, no closed form of the threshold. ``delta(eps)`` is the exact
    delta; ``per_clone(eps)`` the probability of each c and D_{e^eps}(P_c || Q_c)."""

    def __init__(self, n: int, eps0: float):
        alpha = math.exp(eps0) / (1 + math.exp(eps0))
        clones = np.arange(n)
        weights = stats.binom.pmf(clones, n - 1, math.exp(-eps0))
        keep = weights > 1e-40
        self.weights = weights[keep]
        clones = clones[keep]
        outcomes = np.arange(clones.max() + 2)
        at = stats.binom.pmf(outcomes[None, :], clones[:, None], 0.5)
        below = stats.binom.pmf(outcomes[None, :] - 1, clones[:, None], 0.5)
        self.p = alpha * below + (1 - alpha) * at
        self.q = (1 - alpha) * below + alpha * at

    def per_clone(self, eps: float) -> np.ndarray:
        return np.maximum(self.p - math.exp(eps) * self.q, 0).sum(axis=1)

    def delta(self, eps: float) -> float:
        backward = np.maximum(self.q - math.exp(eps) * self.p, 0).sum(axis=1)
        return max(self.weights @ self.per_clone(eps), self.weights @ backward)


def smallest_epsilon(delta_of, delta: float, high: float) -> float:
    low = 0.0
    for _ in range(40):
        middle = (low + high) / 2
        if delta_of(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


@pytest.mark.parametrize(("n", "eps0"), [(300, 1.0), (2000, 3.0)])
def test_fmt_numerical_between_exact_full_sum_and_closed_form(n, eps0):
    delta = 1e-6
    full = FullSumFmt(n, eps0)
    exact = smallest_epsilon(full.delta, delta, eps0)
    ours = acc.fmt_numerical_epsilon(eps0, n, delta)
    assert exact <= ours <= exact + 1e-4

    # A block-walking upper bound in the style of the reference implementation (blocks of 10
    # clone counts, each charged its largest divergence, at the block's first c).
    def blocks(eps):
        forward = full.per_clone(eps)
        starts = np.arange(0, forward.size, 10)
        return np.add.reduceat(full.weights, starts) @ forward[starts]

    assert ours <= smallest_epsilon(blocks, delta, eps0) + 1e-9
    try:
        assert ours < acc.fmt_closed_form_epsilon(eps0, n, delta)
    except acc.BoundOutOfRange:
        assert ours <= eps0


@pytest.mark.parametrize("resolution", [8, 64, 4096])
def test_fmt_delta_bracket_contains_full_sum(resolution):
    n, eps0 = 1500, 1.5
    full = FullSumFmt(n, eps0)
    for eps in (0.05, 0.2, 0.6):
        exact = full.delta(eps)
        bracket = acc.fmt_numerical_delta(eps0, n, eps, resolution=resolution, tail_mass=1e-14)
        assert bracket.lower <= exact * (1 + 1e-9) + 1e-300
        assert exact <= bracket.upper
        if resolution == 4096:  # every clone count evaluated: the bracket is tight
            assert bracket.upper - exact <= 1e-13 + 1e-9 * exact


def test_fmt_delta_matches_high_precision_sum():
    n, eps0, eps = 40, 2.0, 0.8
    with mpmath.workdps(40):
        alpha = mpmath.e**eps0 / (1 + mpmath.e**eps0)
        p_clone = mpmath.e ** (-eps0)
        total = mpmath.mpf(0)
        for c in range(n):
            weight = mpmath.binomial(n - 1, c) * p_clone**c * (1 - p_clone) ** (n - 1 - c)
            for x in range(c + 2):
                at = mpmath.binomial(c, x) / mpmath.mpf(2) ** c if x <= c else 0
                below = mpmath.binomial(c, x - 1) / mpmath.mpf(2) ** c if x >= 1 else 0
                excess = (
                    alpha * below
                    + (1 - alpha) * at
                    - mpmath.e**eps * ((1 - alpha) * below + alpha * at)
                )
                total += weight * max(excess, 0)
    bracket = acc.fmt_numerical_delta(eps0, n, eps, tail_mass=1e-30)
    assert bracket.lower <= float(total) <= bracket.upper
    assert bracket.upper == pytest.approx(float(total), rel=1e-10)


def test_fmt_numerical_check_point():
    # Check point: eps0 = 4, n = 100000, delta = 1e-6 gives about 0.17.
    assert acc.fmt_numerical_epsilon(4.0, 100_000, 1e-6) == pytest.approx(0.17, abs=0.003)


def test_fmt_numerical_at_hundred_million_is_valid_and_monotone():
    values = [acc.fmt_numerical_epsilon(2.0, n, 1e-8) for n in (10**6, 10**7, 10**8)]
    assert values[0] > values[1] > values[2] > 0
    closed = acc.fmt_closed_form_epsilon(2.0, 10**8, 1e-8)
    assert values[2] < closed
    # delta at the returned epsilon is certified, just below it is not.
    assert acc.fmt_numerical_delta(2.0, 10**8, values[2], tail_mass=1e-12).upper <= 1e-8
    assert acc.fmt_numerical_delta(2.0, 10**8, values[2] * 0.99, tail_mass=1e-12).lower > 1e-8


def test_fmt_numerical_monotone_in_epsilon_local_and_never_above_it():
    values = [acc.fmt_numerical_epsilon(e, 5000, 1e-6) for e in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert values == sorted(values)
    assert all(v <= e for v, e in zip(values, (0.5, 1.0, 2.0, 4.0, 8.0), strict=True))
    # One respondent: nothing to hide among, eps = ln((alpha - delta)/(1 - alpha)); also where
    # e^eps0 is so large that 1 - 1/(1+r) rounds to 1 in the threshold.
    for eps0 in (3.0, 40.0, 300.0):
        alpha, rest = 1 / (1 + math.exp(-eps0)), 1 / (1 + math.exp(eps0))
        expected = math.log((alpha - 1e-6) / rest)
        assert expected <= acc.fmt_numerical_epsilon(eps0, 1, 1e-6) <= expected + 1e-6 * eps0
    with pytest.raises(acc.BoundOutOfRange, match="overflows"):
        acc.fmt_numerical_epsilon(750.0, 10, 1e-6)
    assert acc.amplify(750.0, 10, 1e-6).bound == acc.LOCAL
