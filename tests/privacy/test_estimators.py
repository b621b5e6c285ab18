"""Tests of the de-biasing estimators, their variance formulas and the labelled post-processing.

Variance formulas are checked against the papers' closed forms or against an independent exact
computation; randomized checks use fixed seeds at 4.5 standard deviations (~6.8e-6 two-sided per
check).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privacy.estimators import (
    HistogramEstimate,
    clip_nonnegative,
    count_mean_sketch_collision_moment,
    debias_one_hot,
    debias_report_fragments,
    debias_zero_sum,
    longitudinal_marginals,
    norm_sub,
    theorem6_error_bound,
    tree_node_offsets,
)
from privacy.randomizers import CountMeanSketch
from privacy.rng import seeded_generator

Z = 4.5


def test_histogram_estimate_validates():
    estimate = HistogramEstimate(np.array([1, 2]), np.array([0.5, 0.5]), 3)
    assert estimate.estimate.dtype == np.float64 and estimate.respondents == 3.0
    assert len(estimate) == 2 and estimate.postprocessing == "none"
    with pytest.raises(ValueError, match="stderr shape"):
        HistogramEstimate(np.zeros(2), np.zeros(3), 1)
    with pytest.raises(ValueError, match="stderr"):
        HistogramEstimate(np.zeros(2), np.array([1.0, -1.0]), 1)
    with pytest.raises(ValueError, match="respondents"):
        HistogramEstimate(np.zeros(2), np.zeros(2), -1)
    with pytest.raises(ValueError, match="estimate"):
        HistogramEstimate(np.array([np.nan]), np.zeros(1), 1)


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
def test_one_hot_variance_matches_theorems_a2_and_c2(epsilon):
    """samplable-anonymous-aggregation: Var f̃(d) = n 4e^ε/(e^ε-1)^2 + f(d) (asymmetric),
    n e^ε/(e^ε-1)^2 (symmetric); and the estimates equal Algorithms 2 and 4."""
    n = 10_000.0
    counts = np.array([0.0, 10.0, 2500.0, 10_000.0])
    e = math.exp(epsilon)
    sums = np.array([3.0, 400.0, 5000.0, 9000.0])
    asymmetric = debias_one_hot(sums, n, 0.5, 1 / (e + 1))
    # Algorithm 2 prints "- n/(e^ε-1)"; its own proof (E ṽ = 1/(e^ε+1) + (e^ε-1)/(2(e^ε+1)) v)
    # makes the unbiased offset 2n/(e^ε-1).
    np.testing.assert_allclose(asymmetric.estimate, 2 * (1 + e) / (e - 1) * sums - 2 * n / (e - 1))
    # The variance plugs in the clipped estimate; feed sums whose estimate is the true count.
    exact_sums = counts * 0.5 + (n - counts) / (e + 1)
    asymmetric = debias_one_hot(exact_sums, n, 0.5, 1 / (e + 1))
    np.testing.assert_allclose(asymmetric.stderr**2, n * 4 * e / (e - 1) ** 2 + counts)
    symmetric = debias_one_hot(sums, n, e / (1 + e), 1 / (1 + e))
    np.testing.assert_allclose(symmetric.estimate, (1 + e) / (e - 1) * sums - n / (e - 1))
    np.testing.assert_allclose(symmetric.stderr**2, n * e / (e - 1) ** 2)


@pytest.mark.parametrize("bit", [0, 1])
def test_report_fragment_variance_matches_exact_enumeration(bit):
    """Distribution of one respondent's fragment sum: a mixture over the backstop bit x'."""
    backstop, keep, tau, n = 0.9, 0.7, 5, 1000.0
    ones = np.arange(tau + 1)
    p_backstop_one = backstop if bit else 1 - backstop
    pmf = p_backstop_one * stats.binom.pmf(ones, tau, keep) + (
        1 - p_backstop_one
    ) * stats.binom.pmf(ones, tau, 1 - keep)
    mean = (ones * pmf).sum()
    variance = ((ones - mean) ** 2 * pmf).sum()
    gap = tau * (2 * backstop - 1) * (2 * keep - 1)
    result = debias_report_fragments(np.array([n * mean]), n, backstop, keep, tau)
    # A bucket where every respondent holds ``bit``: the estimate is n*bit, the variance n Var/gap^2.
    assert result.estimate[0] == pytest.approx(n * bit)
    assert result.stderr[0] ** 2 == pytest.approx(n * variance / gap**2)


def test_zero_sum_estimate_and_variance():
    result = debias_zero_sum(np.array([700.0, 1500.0]), 1000, 0.7)
    np.testing.assert_allclose(result.estimate, [0.0, 800.0])
    np.testing.assert_allclose(result.stderr, math.sqrt(1000 * 0.7 * 0.3))


def test_collision_moment_is_unbiased_over_random_hashes_without_noise():
    """Noiseless sketch (p_one = 1, p_zero = 0), one row, a fresh random hash per draw."""
    rng = seeded_generator(300)
    counts = np.array([500, 300, 100, 50, 25, 25, 0, 0, 0, 0])
    width, draws = 8, 4000
    estimates = []
    for _ in range(draws):
        columns = rng.integers(0, width, counts.size)
        sketch = np.bincount(columns, weights=counts, minlength=width)[None, :]
        estimates.append(count_mean_sketch_collision_moment(sketch, counts.sum(), 1.0, 0.0))
    estimates = np.array(estimates)
    truth = float((counts**2).sum())
    assert abs(estimates.mean() - truth) <= Z * estimates.std() / math.sqrt(draws)


def test_collision_moment_is_unbiased_over_hash_seeds_with_noise():
    rng = seeded_generator(301)
    values = rng.choice(20, size=3000, p=np.arange(20, 0, -1) / 210)
    truth = float((np.bincount(values) ** 2).sum())
    estimates = []
    for seed in range(150):
        sketch = CountMeanSketch(
            num_hashes=4, width=16, epsilon=3.0, hash_seed=seed, domain_size=20
        )
        sums = sketch.randomize(values, rng).bucket_sums(sketch.message_domain_size)
        estimates.append(
            count_mean_sketch_collision_moment(
                sums.reshape(4, 16), values.size, sketch.p_one, sketch.p_zero
            )
        )
    estimates = np.array(estimates)
    assert abs(estimates.mean() - truth) <= Z * estimates.std() / math.sqrt(estimates.size)


def test_tree_node_offsets():
    assert tree_node_offsets(8).tolist() == [0, 8, 12, 14]
    assert tree_node_offsets(1).tolist() == [0]
    with pytest.raises(ValueError, match="power of two"):
        tree_node_offsets(6)


@pytest.mark.parametrize("periods", [1, 2, 8, 32])
def test_longitudinal_marginals_sum_the_dyadic_cover(periods):
    """With exact tree sums of a leaf vector, f̃_t / (c k L) is the prefix sum up to t."""
    rng = seeded_generator(302)
    leaves = rng.integers(-5, 6, periods).astype(float)
    offsets = tree_node_offsets(periods)
    node_sums = np.zeros(2 * periods - 1)
    for level in range(periods.bit_length()):
        size = 1 << level
        node_sums[offsets[level] : offsets[level] + periods // size] = leaves.reshape(-1, size).sum(
            axis=1
        )
    keep, changes, n = 0.8, 3, 50.0
    levels = periods.bit_length()
    scale = changes * levels / (2 * keep - 1)
    result = longitudinal_marginals(node_sums, n, periods, changes, keep)
    np.testing.assert_allclose(result.estimate / scale, np.cumsum(leaves))
    cover = np.array([bin(t).count("1") for t in range(1, periods + 1)])
    expected = np.maximum(scale**2 * n * cover / levels - np.clip(result.estimate, 0, n), 0)
    np.testing.assert_allclose(result.stderr**2, expected)


def test_theorem6_bound_behaves_like_the_theorem():
    base = theorem6_error_bound(10_000, 16, 2, 1.0, 0.01)
    assert theorem6_error_bound(10_000, 16, 2, 1.0, 1e-6) > base
    assert theorem6_error_bound(10_000, 16, 4, 1.0, 0.01) > base
    assert theorem6_error_bound(10_000, 16, 2, 2.0, 0.01) < base
    # Leading term ~ c k L sqrt(2 n log2(d) ln(2d/β) / L): doubling sqrt(n) doubles it.
    ratio = theorem6_error_bound(4e8, 16, 2, 1.0, 0.01) / theorem6_error_bound(
        1e8, 16, 2, 1.0, 0.01
    )
    assert ratio == pytest.approx(2.0, rel=1e-3)
    with pytest.raises(ValueError, match="failure_probability"):
        theorem6_error_bound(100, 16, 2, 1.0, 1.5)
    with pytest.raises(ValueError, match="power of two"):
        theorem6_error_bound(100, 12, 2, 1.0)


def test_clip_nonnegative_is_labelled_and_keeps_stderr():
    original = HistogramEstimate(np.array([-3.0, 2.0, 5.0]), np.array([1.0, 1.0, 2.0]), 4)
    clipped = clip_nonnegative(original)
    assert clipped.estimate.tolist() == [0.0, 2.0, 5.0]
    assert clipped.postprocessing == "clip_nonnegative"
    np.testing.assert_array_equal(clipped.stderr, original.stderr)
    assert original.estimate[0] == -3.0 and original.postprocessing == "none"


def test_norm_sub_is_the_projection_onto_the_scaled_simplex():
    rng = seeded_generator(303)
    values = rng.normal(10, 30, 200)
    original = HistogramEstimate(values, np.ones(200), 1000)
    projected = norm_sub(original)
    result = projected.estimate
    assert projected.postprocessing == "norm_sub"
    assert result.min() >= 0 and result.sum() == pytest.approx(1000)
    # KKT: positive entries moved by one common θ; zeroed entries were at most θ.
    positive = result > 0
    theta = values[positive] - result[positive]
    np.testing.assert_allclose(theta, theta[0])
    assert np.all(values[~positive] <= theta[0] + 1e-9)
    assert norm_sub(clip_nonnegative(original), 500).postprocessing == "clip_nonnegative+norm_sub"
    assert norm_sub(original, 0).estimate.sum() == 0
    with pytest.raises(ValueError, match="total"):
        norm_sub(original, -1)
