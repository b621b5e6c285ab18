"""``randomize`` and ``sample_bucket_sums`` draw from exactly the probabilities the exact-ε tests
use (tests/privacy/test_randomizers_exact.py); hashes of the sketch are stable and uniform.

Fixed seeds; each check sits at 4.5 standard deviations or at a p-value of 1e-6, so a correct
implementation fails a given test with probability below ~1e-4 for a fresh seed."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from privacy.messages import MessageBatch
from privacy.randomizers import CountMeanSketch, LongitudinalClient, OneHotRappor, ReportFragmented
from privacy.rng import seeded_generator
from tests.privacy.randomizer_references import P_VALUE, Z, longitudinal_output_log_probabilities


def _chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def test_one_hot_rappor_randomize_matches_its_distribution():
    """Sparse path (d = 4096): messages distinct and sorted, counts binomial, positions uniform."""
    randomizer = OneHotRappor(4096, 7.0)
    rng = seeded_generator(101)
    n = 40_000
    values = (rng.zipf(1.5, n) - 1) % randomizer.domain_size
    batch = randomizer.randomize(values, rng)
    keys = batch.respondent * randomizer.domain_size + batch.bucket
    assert np.all(np.diff(keys) > 0)  # sorted by respondent, then bucket; no repeated bit
    assert np.all(batch.sign == 1) and not batch.fragment.any() and not batch.period.any()
    own = batch.bucket == values[batch.respondent]
    kept = own.sum()
    assert abs(kept - n * randomizer.p_one) <= Z * math.sqrt(
        n * randomizer.p_one * (1 - randomizer.p_one)
    )
    # False set bits per respondent ~ Binomial(d - 1, p_zero): chi-square with a pooled tail.
    false_counts = np.bincount(batch.respondent[~own], minlength=n)
    distribution = stats.binom(randomizer.domain_size - 1, randomizer.p_zero)
    top = 10
    observed = np.bincount(np.minimum(false_counts, top), minlength=top + 1)
    expected = np.append(distribution.pmf(np.arange(top)), distribution.sf(top - 1))
    assert _chi_square_p_value(observed, expected) > P_VALUE
    # Positions of false bits relative to the own value: uniform over the d - 1 other buckets.
    offsets = (batch.bucket[~own] - values[batch.respondent[~own]]) % randomizer.domain_size
    assert offsets.min() >= 1
    observed = np.bincount((offsets - 1) * 64 // (randomizer.domain_size - 1), minlength=64)
    assert _chi_square_p_value(observed, np.ones(64)) > P_VALUE


def _standardized(sums: np.ndarray, true_counts: np.ndarray, p_one: float, p_zero: float):
    n = true_counts.sum()
    mean = true_counts * p_one + (n - true_counts) * p_zero
    variance = true_counts * p_one * (1 - p_one) + (n - true_counts) * p_zero * (1 - p_zero)
    return (sums - mean) / np.sqrt(variance)


def test_sample_bucket_sums_agrees_with_summing_randomize():
    """Both must follow Binomial(c_j, p_one) + Binomial(n - c_j, p_zero) per bucket."""
    randomizer = OneHotRappor(2048, 6.0)
    rng = seeded_generator(102)
    n, trials = 3_000, 40
    values = (rng.zipf(1.3, n) - 1) % randomizer.domain_size
    true_counts = np.bincount(values, minlength=randomizer.domain_size)
    summed = np.stack(
        [
            randomizer.randomize(values, rng).bucket_sums(randomizer.domain_size)
            for _ in range(trials)
        ]
    )
    sampled = np.stack([randomizer.sample_bucket_sums(true_counts, rng) for _ in range(trials)])
    args = (true_counts, randomizer.p_one, randomizer.p_zero)
    z_summed = _standardized(summed, *args).ravel()
    z_sampled = _standardized(sampled, *args).ravel()
    size = z_summed.size
    for z in (z_summed, z_sampled):
        assert abs(z.mean()) <= Z / math.sqrt(size)
        assert abs(np.mean(z**2) - 1) <= Z * np.std(z**2) / math.sqrt(size)
    assert stats.ks_2samp(z_summed, z_sampled).pvalue > P_VALUE


def test_report_fragmented_sample_bucket_sums_agrees_with_randomize():
    randomizer = ReportFragmented(
        backstop_epsilon=6.0, fragment_epsilon=5.0, fragments=3, domain_size=512
    )
    rng = seeded_generator(103)
    n, trials = 2_000, 60
    values = rng.integers(0, 40, n)
    true_counts = np.bincount(values, minlength=randomizer.domain_size)
    batch = randomizer.randomize(values, rng)
    assert set(np.unique(batch.fragment)) == {1, 2, 3}
    order = np.lexsort((batch.bucket, batch.fragment, batch.respondent))
    assert np.array_equal(order, np.arange(len(batch)))  # sorted by respondent, fragment, bucket
    summed = np.stack(
        [
            randomizer.randomize(values, rng).bucket_sums(randomizer.domain_size)
            for _ in range(trials)
        ]
    )
    sampled = np.stack([randomizer.sample_bucket_sums(true_counts, rng) for _ in range(trials)])
    # Exact per-bucket moments: τ fragments share the backstop bit.
    a, r, tau = randomizer.backstop_keep, randomizer.fragment_keep, randomizer.fragments
    own = a * r + (1 - a) * (1 - r)
    other = (1 - a) * r + a * (1 - r)
    mean = tau * (true_counts * own + (n - true_counts) * other)
    variance = n * (tau * r * (1 - r) + tau**2 * (2 * r - 1) ** 2 * a * (1 - a))
    for sums in (summed, sampled):
        z = ((sums - mean) / math.sqrt(variance)).ravel()
        assert abs(z.mean()) <= Z / math.sqrt(z.size)
        assert abs(np.mean(z**2) - 1) <= Z * np.std(z**2) / math.sqrt(z.size)
    assert (
        stats.ks_2samp(
            summed.ravel() - np.tile(mean, trials), sampled.ravel() - np.tile(mean, trials)
        ).pvalue
        > P_VALUE
    )


def test_report_fragments_from_a_stored_backstop():
    """A memoized backstop may come back in any order; fragments must not depend on it."""
    randomizer = ReportFragmented(
        backstop_epsilon=4.0, fragment_epsilon=3.0, fragments=2, domain_size=300
    )
    rng = seeded_generator(105)
    backstop = randomizer.backstop(rng.integers(0, 300, 50), rng)
    descending = np.lexsort((-backstop.bucket, backstop.respondent))  # buckets reversed per row
    shuffled = MessageBatch(
        *(
            getattr(backstop, name)[descending]
            for name in ("respondent", "bucket", "sign", "fragment", "period")
        )
    )
    assert not np.array_equal(shuffled.bucket, backstop.bucket)
    a = randomizer.fragment(backstop, 50, seeded_generator(7))
    b = randomizer.fragment(shuffled, 50, seeded_generator(7))
    assert np.array_equal(a.bucket, b.bucket) and np.array_equal(a.fragment, b.fragment)
    doubled = MessageBatch.concatenate([backstop, backstop])
    with pytest.raises(ValueError, match="repeats a bucket"):
        randomizer.fragment(doubled, 50, rng)


def test_count_mean_sketch_hash_is_stable_uniform_and_universal():
    """Same seed, same columns; columns uniform; each pair of values collides in ~1/width rows."""
    rows, width = 4000, 16
    sketch = CountMeanSketch(rows, width, 1.0, 42, 1 << 20)
    again = CountMeanSketch(rows, width, 1.0, 42, 1 << 20)
    values = np.array([0, 1, 2, 1000, 1 << 19])
    columns = np.stack([sketch.hash_columns(np.full(rows, v), np.arange(rows)) for v in values])
    assert np.array_equal(
        columns, np.stack([again.hash_columns(np.full(rows, v), np.arange(rows)) for v in values])
    )
    other = CountMeanSketch(rows, width, 1.0, 43, 1 << 20)
    assert not np.array_equal(columns[0], other.hash_columns(np.zeros(rows, int), np.arange(rows)))
    for row_columns in columns:
        observed = np.bincount(row_columns, minlength=width)
        assert _chi_square_p_value(observed, np.ones(width)) > P_VALUE
    sd = math.sqrt(rows * (1 / width) * (1 - 1 / width))
    for a, b in itertools.combinations(range(values.size), 2):
        collisions = np.count_nonzero(columns[a] == columns[b])
        assert abs(collisions - rows / width) <= Z * sd


def test_sketch_row_hashing_matches_the_per_pair_hash():
    sketch = CountMeanSketch(8, 1 << 12, 1.0, 7, 5000)
    values = np.arange(5000)
    keys = sketch.hashes.keys(values)
    buffer = np.empty_like(keys)
    for row in range(sketch.num_hashes):
        expected = sketch.hash_columns(values, np.full(values.size, row))
        assert np.array_equal(sketch.hashes.row_columns(row, keys, buffer), expected)
        assert np.array_equal(sketch.hashes.row_columns(row, keys), expected)
    with pytest.raises(ValueError, match="row"):
        sketch.hashes.row_columns(8, keys)
    with pytest.raises(ValueError, match="uint64"):
        sketch.hashes.row_columns(0, values)
    with pytest.raises(ValueError, match="values"):
        sketch.hashes.keys(np.array([-1]))


def test_longitudinal_randomize_matches_algorithm_1():
    """Per-client outputs (h*, u_1..u_H) against the exact distribution, for one state path."""
    client = LongitudinalClient(periods=4, max_changes=2, epsilon=1.0)
    rng = seeded_generator(104)
    path = np.array([0, 1, 1, 0], dtype=bool)  # changes +1 at t = 2, -1 at t = 4
    n = 30_000
    batch = client.randomize(np.tile(path, (n, 1)), rng)
    assert np.all(np.diff(batch.respondent) >= 0)
    offsets = np.array([0, 4, 6])
    levels = np.searchsorted(offsets, batch.bucket, side="right")
    # Each client reports at one level, once per period divisible by 2^(h-1), in period order.
    per_client_level = np.zeros(n, dtype=int)
    per_client_level[batch.respondent] = levels
    assert np.all(levels == per_client_level[batch.respondent])
    assert np.all(batch.period % (1 << (levels - 1)) == 0)
    # Index each client's output among the 22 outputs in the order of the exact computation.
    index = np.zeros(n, dtype=int)
    first = np.array([0, 16, 20])
    for level in (1, 2, 3):
        clients = np.flatnonzero(per_client_level == level)
        nodes = 4 >> (level - 1)
        signs = batch.sign[np.isin(batch.respondent, clients)].reshape(clients.size, nodes)
        bits = (signs > 0).astype(int)
        index[clients] = first[level - 1] + bits @ (1 << np.arange(nodes - 1, -1, -1))
    observed = np.bincount(index, minlength=22)
    expected = np.exp(
        longitudinal_output_log_probabilities(client, np.diff(path.astype(int), prepend=0))
    )
    assert _chi_square_p_value(observed, expected) > P_VALUE
