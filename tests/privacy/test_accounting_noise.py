"""Tests of the noise privacy.accounting calibrates: randomized report deletion (Laplace and
discrete Laplace, Theorem V.2) and the Gaussian baseline (paper sigma and the exact Balle-Wang
sigma against mpmath)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from privacy import accounting as acc
from privacy.rng import seeded_generator

# ---------------------------------------------------------------------------------------------
# Randomized report deletion
# ---------------------------------------------------------------------------------------------


def test_deletion_noise_parameters():
    noise = acc.deletion_noise(0.5, 1e-6)
    assert noise.scale == pytest.approx(4.0)
    assert noise.offset == pytest.approx(4.0 * math.log(2e6))
    assert noise.offset_records == math.ceil(noise.offset)
    with pytest.raises(ValueError, match="delta_deletion"):
        acc.deletion_noise(0.5, 2.0)


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-320), (5e-324, 1e-6)])
def test_deletion_noise_refuses_an_offset_beyond_floating_point(epsilon, delta):
    # 2/delta or 2/eps overflows to inf: no integer offset; a ValueError, not an OverflowError.
    with pytest.raises(ValueError, match="beyond floating point"):
        acc.deletion_noise(epsilon, delta)


def test_deletion_bounds_tail_probabilities():
    for epsilon, delta, crowds in [(0.5, 1e-6, 1), (1.0, 1e-3, 100), (3.0, 1e-6, 1)]:
        bounds = acc.deletion_bounds(epsilon, delta, crowds)
        noise = acc.deletion_noise(epsilon, delta)
        laplace = stats.laplace(scale=noise.scale)
        # Theorem V.2: P crowds each exceed the bound with probability P[L < o - bound].
        assert crowds * laplace.cdf(noise.offset - bounds.high_probability) <= delta
        assert bounds.high_probability_tail <= bounds.high_probability
        assert crowds * laplace.cdf(noise.offset - bounds.high_probability_tail) <= delta * (
            1 + 1e-9
        )
        assert bounds.abort_probability == pytest.approx(laplace.sf(noise.offset))
        # Discrete Laplace of the same scale: same guarantees (module docstring).
        q = math.exp(-1 / noise.scale)
        assert bounds.abort_probability_discrete <= delta / 2
        extra = bounds.high_probability_discrete - noise.offset_records
        assert crowds * q ** (extra + 1) / (1 + q) <= delta
        assert crowds * q**extra / (1 + q) > delta or extra == 0  # smallest such count
        assert bounds.high_probability_discrete <= bounds.high_probability + 1


def test_expected_deletions_continuous_monte_carlo():
    # 200,000 draws; tolerance 5 standard errors (sd of a deletion is sqrt(2) b): ~6e-7 per check.
    noise = acc.deletion_noise(0.5, 1e-3)
    draws = seeded_generator(20240611).laplace(0.0, noise.scale, size=200_000)
    kept = draws[draws <= noise.offset]
    deletions = noise.offset - kept
    expected = acc.deletion_bounds(0.5, 1e-3, 1).expected
    assert deletions.mean() == pytest.approx(
        expected, abs=5 * math.sqrt(2) * noise.scale / math.sqrt(kept.size)
    )


def test_expected_deletions_discrete_exact_sum():
    noise = acc.deletion_noise(0.8, 1e-2)
    q = math.exp(-1 / noise.scale)
    values = np.arange(-2000, 2001)
    pmf = (1 - q) / (1 + q) * q ** np.abs(values)
    m = noise.offset_records
    kept = values <= m
    mean = float(((m - values[kept]) * pmf[kept]).sum() / pmf[kept].sum())
    bounds = acc.deletion_bounds(0.8, 1e-2, 1)
    assert bounds.expected_discrete == pytest.approx(mean, rel=1e-12)
    assert bounds.abort_probability_discrete == pytest.approx(
        float(pmf[values > m].sum()), rel=1e-9
    )


# ---------------------------------------------------------------------------------------------
# Gaussian baseline
# ---------------------------------------------------------------------------------------------


def mp_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0):
    """Balle-Wang delta(eps) for a Gaussian of standard deviation sigma, at 50 digits."""
    with mpmath.workdps(50):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sensitivity)
        return mpmath.ncdf(d / (2 * s) - e * s / d) - mpmath.e**e * mpmath.ncdf(
            -d / (2 * s) - e * s / d
        )


@pytest.mark.parametrize(
    ("epsilon", "delta", "sensitivity"),
    [
        (1.0, 5e-10, 1.0),
        (0.05, 5e-8, 1.0),
        (0.0025, 5e-10, 1.0),
        (3.0, 1e-6, 2.0),
        (10.0, 1e-12, 1.0),
    ],
)
def test_exact_gaussian_sigma_against_mpmath(epsilon, delta, sensitivity):
    sigma = acc.gaussian_sigma_exact(epsilon, delta, sensitivity)
    assert mp_gaussian_delta(sigma, epsilon, sensitivity) <= delta * (1 + 1e-9)
    assert mp_gaussian_delta(sigma * (1 - 1e-6), epsilon, sensitivity) > delta
    assert acc.gaussian_delta(sigma, epsilon, sensitivity) == pytest.approx(
        float(mp_gaussian_delta(sigma, epsilon, sensitivity)), rel=1e-8
    )


def test_paper_sigma_is_not_always_private():
    strong = acc.gaussian_baseline(1.0, 5e-10)
    assert not strong.paper_sigma_is_private
    assert strong.paper_delta == pytest.approx(
        float(mp_gaussian_delta(strong.sigma_paper, 1.0)), rel=1e-8
    )
    assert strong.sigma_exact > strong.sigma_paper
    weak = acc.gaussian_baseline(0.0025, 5e-10)
    assert weak.paper_sigma_is_private and weak.sigma_paper > weak.sigma_exact
