"""Estimators of the local randomizers: unbiased, and their standard errors match the spread.

Fixed seeds; each check sits at 4.5 standard deviations, so a correct implementation fails a
given test with probability below ~1e-4 for a fresh seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy.randomizers import (
    AsymmetricOneHot,
    BinaryRandomizedResponse,
    CountMeanSketch,
    LongitudinalClient,
    OneHotRappor,
    ReportFragmented,
    SymmetricOneHot,
    ZeroSumHistogram,
)
from privacy.rng import seeded_generator
from tests.privacy.randomizer_references import Z


def _trial_estimates(randomizer, values: np.ndarray, trials: int, rng):
    """Estimates of ``trials`` independent runs, randomized in one call (respondents tiled)."""
    n = values.shape[0]
    reps = (trials,) + (1,) * (values.ndim - 1)
    batch = randomizer.randomize(np.tile(values, reps), rng)
    size = randomizer.message_domain_size
    trial = batch.respondent // n
    sums = np.bincount(trial * size + batch.bucket, weights=batch.sign, minlength=trials * size)
    estimates = [randomizer.estimate(row, n) for row in sums.reshape(trials, size)]
    return np.stack([e.estimate for e in estimates]), np.stack([e.stderr for e in estimates])


def _assert_unbiased_and_calibrated(estimates, stderrs, truth, independent_buckets: bool):
    """Per bucket: mean error within 4.5 standard errors of the mean. Pooled: mean z^2 ≈ 1.

    Buckets of one trial may be correlated; then only the trials count as independent draws
    (a mean over correlated buckets has variance at most that of one bucket).
    """
    trials = estimates.shape[0]
    error = estimates - truth
    bias_limit = Z * np.sqrt(np.mean(stderrs**2, axis=0) / trials)
    assert np.all(np.abs(error.mean(axis=0)) <= bias_limit)
    z_squared = (error / stderrs) ** 2
    draws = z_squared.size if independent_buckets else trials
    spread = np.std(z_squared if independent_buckets else z_squared.mean(axis=1))
    assert abs(z_squared.mean() - 1) <= Z * spread / math.sqrt(draws)


@pytest.mark.parametrize(
    "randomizer",
    [
        OneHotRappor(8, 1.5),
        SymmetricOneHot(8, 1.0),
        AsymmetricOneHot(8, 2.0),
        ReportFragmented(backstop_epsilon=2.0, fragment_epsilon=1.0, fragments=3, domain_size=8),
        ZeroSumHistogram(domain_size=8, epsilon=1.0, delta=1e-3, respondents=1000),
    ],
    ids=lambda r: r.name,
)
def test_small_domain_estimators_are_unbiased_and_calibrated(randomizer):
    rng = seeded_generator(200)
    values = rng.choice(8, size=1000, p=[0.4, 0.2, 0.15, 0.1, 0.08, 0.05, 0.02, 0.0])
    estimates, stderrs = _trial_estimates(randomizer, values, 300, rng)
    truth = np.bincount(values, minlength=8)
    _assert_unbiased_and_calibrated(estimates, stderrs, truth, independent_buckets=True)


@pytest.mark.parametrize(
    "randomizer",
    [
        OneHotRappor(1024, 6.0),
        ReportFragmented(backstop_epsilon=6.0, fragment_epsilon=5.0, fragments=2, domain_size=512),
    ],
    ids=lambda r: r.name,
)
def test_sparse_estimators_are_unbiased_and_calibrated(randomizer):
    rng = seeded_generator(201)
    values = (rng.zipf(1.4, 2000) - 1) % randomizer.domain_size
    estimates, stderrs = _trial_estimates(randomizer, values, 120, rng)
    truth = np.bincount(values, minlength=randomizer.domain_size)
    _assert_unbiased_and_calibrated(estimates, stderrs, truth, independent_buckets=True)


def test_binary_rr_estimator_is_unbiased_and_calibrated():
    randomizer = BinaryRandomizedResponse(1.0)
    rng = seeded_generator(202)
    values = (rng.random(1500) < 0.3).astype(np.int64)
    estimates, stderrs = _trial_estimates(randomizer, values, 400, rng)
    truth = np.bincount(values, minlength=2)
    np.testing.assert_allclose(estimates.sum(axis=1), 1500)
    _assert_unbiased_and_calibrated(estimates, stderrs, truth, independent_buckets=False)


@pytest.mark.parametrize("width, epsilon", [(16, 2.0), (256, 5.0)], ids=["dense", "sparse"])
def test_count_mean_sketch_is_unbiased_over_hash_draws_and_calibrated(width, epsilon):
    """Unbiased over the draw of the hash family: every trial uses its own hash_seed."""
    rng = seeded_generator(203)
    domain = 40
    values = rng.choice(domain, size=2000, p=np.arange(domain, 0, -1) / (domain * (domain + 1) / 2))
    truth = np.bincount(values, minlength=domain)
    estimates, stderrs = [], []
    for seed in range(150):
        sketch = CountMeanSketch(
            num_hashes=4, width=width, epsilon=epsilon, hash_seed=seed, domain_size=domain
        )
        batch = sketch.randomize(values, rng)
        assert batch.bucket.max() < sketch.message_domain_size
        estimate = sketch.estimate(batch.bucket_sums(sketch.message_domain_size), values.size)
        estimates.append(estimate.estimate)
        stderrs.append(estimate.stderr)
    _assert_unbiased_and_calibrated(
        np.array(estimates), np.array(stderrs), truth, independent_buckets=False
    )


def _state_paths(n: int, periods: int, max_changes: int, rng) -> np.ndarray:
    """Boolean state paths from 0 with at most ``max_changes`` changes each."""
    states = np.zeros((n, periods), dtype=bool)
    for _ in range(max_changes):
        start = rng.integers(0, periods + 1, size=n)  # periods + 1: no change
        states ^= np.arange(periods)[None, :] >= start[:, None]
    return states


def test_longitudinal_estimator_is_unbiased_and_calibrated():
    client = LongitudinalClient(periods=8, max_changes=2, epsilon=1.0)
    rng = seeded_generator(204)
    states = _state_paths(800, 8, 2, rng)
    estimates, stderrs = _trial_estimates(client, states, 250, rng)
    _assert_unbiased_and_calibrated(
        estimates, stderrs, states.sum(axis=0), independent_buckets=False
    )


def test_longitudinal_marginals_within_theorem_6_bound():
    client = LongitudinalClient(periods=16, max_changes=3, epsilon=1.0)
    rng = seeded_generator(205)
    n = 20_000
    states = _state_paths(n, 16, 3, rng)
    batch = client.randomize(states, rng)
    estimate = client.estimate(batch.bucket_sums(client.message_domain_size), n)
    bound = client.error_bound(
        n, failure_probability=1e-6
    )  # Bernstein + union bound: P(fail) <= 1e-6
    assert np.max(np.abs(estimate.estimate - states.sum(axis=0))) <= bound
    assert bound >= Z * estimate.stderr.max()  # the bound is no tighter than 4.5 standard errors


def test_longitudinal_streaming_validates_its_input():
    client = LongitudinalClient(periods=4, max_changes=1, epsilon=1.0)
    rng = seeded_generator(206)
    with pytest.raises(ValueError, match="max_changes"):
        client.randomize(np.array([[1, 0, 1, 0]], dtype=bool), rng)
    state = client.start(3, rng)
    for _ in range(4):
        state, batch = client.update(state, np.zeros(3, dtype=int), rng)
        assert np.all(batch.period == state.period)
    with pytest.raises(ValueError, match="already processed"):
        client.update(state, np.zeros(3, dtype=int), rng)
    with pytest.raises(ValueError, match="-1, 0 or"):
        client.update(client.start(3, rng), np.array([0, 2, 0]), rng)
