"""Tests of the local randomizers: exact ε, unbiased estimates, calibrated standard errors.

Exact-ε tests enumerate every output of a small instance and compute likelihoods from the
randomizer's per-bit (per-node) probabilities; the distribution tests check that ``randomize``
draws from exactly those probabilities. Randomized tests use fixed seeds; each check sits at
4.5 standard deviations (two-sided normal tail ~6.8e-6) or at a p-value of 1e-6, so a correct
implementation fails a given test with probability below ~1e-4 for a fresh seed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from privacy.messages import MessageBatch
from privacy.randomizers import (
    RANDOMIZERS,
    AsymmetricOneHot,
    BinaryRandomizedResponse,
    CountMeanSketch,
    LongitudinalClient,
    OneHotRappor,
    ReportFragmented,
    SymmetricOneHot,
    ZeroSumHistogram,
    build_randomizer,
)
from privacy.rng import seeded_generator

Z = 4.5  # two-sided normal tail ~6.8e-6 per check
P_VALUE = 1e-6


# ----------------------------------------------------------------------------------------------
# Exact likelihood-ratio checks
# ----------------------------------------------------------------------------------------------


def _bit_log_probabilities(outputs: np.ndarray, bits: np.ndarray, p_one: float, p_zero: float):
    """log P(outputs | input bits) for independent per-bit randomized response."""
    reported_one = np.where(bits, p_one, p_zero)
    log_one = np.log(reported_one)
    log_zero = np.log1p(-reported_one)
    return np.where(outputs, log_one, log_zero).sum(axis=-1)


def _max_log_ratio(log_a: np.ndarray, log_b: np.ndarray) -> float:
    return float(np.max(np.abs(log_a - log_b)))


def _assert_exact_epsilon(largest: float, epsilon: float) -> None:
    """The worst log-ratio is ε and never above it, up to double precision.

    At ε = 13.14 a flip probability of 2e-6 is held to ~1e-16 absolute, i.e. ~5e-11 relative, so
    the computed log-ratio carries errors of that size; 1e-9 is the resolution of the check.
    """
    assert largest <= epsilon + 1e-9
    assert largest == pytest.approx(epsilon, abs=1e-9)


def _one_hot_log_probabilities(randomizer, inputs: np.ndarray) -> list[np.ndarray]:
    """log P(outputs | input bits) over every output vector, one array per row of ``inputs``."""
    outputs = np.array(list(itertools.product([False, True], repeat=inputs.shape[1])))
    return [
        _bit_log_probabilities(outputs, bits, randomizer.p_one, randomizer.p_zero)
        for bits in inputs
    ]


def test_binary_rr_epsilon_is_exact():
    randomizer = BinaryRandomizedResponse(1.7)
    # Outputs: no message, one message in bucket 0.
    log_false, log_true = _one_hot_log_probabilities(randomizer, np.array([[False], [True]]))
    assert randomizer.ldp_kind == "replacement"
    _assert_exact_epsilon(_max_log_ratio(log_true, log_false), randomizer.epsilon_local)


@pytest.mark.parametrize(
    "randomizer",
    [OneHotRappor(4, 1.3), OneHotRappor(4, 13.14), SymmetricOneHot(4, 0.7)],
    ids=["rappor", "rappor-paper-eps", "symmetric"],
)
def test_removal_one_hot_epsilon_is_exact(randomizer):
    """Removal LDP against the randomized all-zeros vector (proof of Theorem III.1)."""
    d = randomizer.domain_size
    inputs = np.vstack([np.zeros((1, d), bool), np.eye(d, dtype=bool)])
    reference, *per_value = _one_hot_log_probabilities(randomizer, inputs)
    largest = max(_max_log_ratio(logs, reference) for logs in per_value)
    assert randomizer.ldp_kind == "removal"
    _assert_exact_epsilon(largest, randomizer.epsilon_local)


def test_symmetric_one_hot_replacement_epsilon_is_twice_removal():
    randomizer = SymmetricOneHot(3, 0.9)
    logs = _one_hot_log_probabilities(randomizer, np.eye(3, dtype=bool))
    largest = max(_max_log_ratio(a, b) for a, b in itertools.combinations(logs, 2))
    _assert_exact_epsilon(largest, randomizer.replacement_epsilon)


def test_asymmetric_one_hot_replacement_epsilon_is_exact():
    randomizer = AsymmetricOneHot(4, 1.1)
    logs = _one_hot_log_probabilities(randomizer, np.eye(4, dtype=bool))
    largest = max(_max_log_ratio(a, b) for a, b in itertools.permutations(logs, 2))
    assert randomizer.ldp_kind == "replacement"
    _assert_exact_epsilon(largest, randomizer.epsilon_local)


def test_count_mean_sketch_removal_epsilon_is_exact():
    """Outputs: nothing, or a non-empty set of columns of one row; reference: a random row of zeros."""
    sketch = CountMeanSketch(num_hashes=3, width=4, epsilon=1.6, hash_seed=11, domain_size=6)
    k, m = sketch.num_hashes, sketch.width
    patterns = np.array(list(itertools.product([False, True], repeat=m)))[1:]  # non-empty rows
    p1, p0 = sketch.p_one, sketch.p_zero
    reference = np.concatenate(
        [
            [m * math.log1p(-p0)],
            np.tile(_bit_log_probabilities(patterns, np.zeros(m, bool), p1, p0) - math.log(k), k),
        ]
    )
    largest = 0.0
    for value in range(sketch.domain_size):
        columns = sketch.hash_columns(np.full(k, value), np.arange(k))
        per_row = [
            _bit_log_probabilities(patterns, np.eye(m, dtype=bool)[columns[row]], p1, p0)
            - math.log(k)
            for row in range(k)
        ]
        empty = math.log1p(-p1) + (m - 1) * math.log1p(-p0)
        largest = max(largest, _max_log_ratio(np.concatenate([[empty], *per_row]), reference))
    _assert_exact_epsilon(largest, sketch.epsilon_local)


def _fragment_log_probabilities(fragments: np.ndarray, bit: bool, backstop: float, keep: float):
    """log P(fragment bits | input bit), x' = RR(bit; backstop) shared by the fragments."""
    total = np.zeros(fragments.shape[0])
    for backstop_bit, weight in (
        (True, backstop if bit else 1 - backstop),
        (False, 1 - backstop if bit else backstop),
    ):
        p = np.where(fragments == backstop_bit, keep, 1 - keep)
        total += weight * np.prod(p, axis=1)
    return np.log(total)


@pytest.mark.parametrize("observed", [1, 2, 3])
def test_report_fragmented_epsilon_is_exact(observed):
    """Theorem IV.1 for an adversary seeing ``observed`` fragments, removal basis, domain of 3."""
    randomizer = ReportFragmented(
        backstop_epsilon=2.2, fragment_epsilon=0.9, fragments=3, domain_size=3
    )
    d = randomizer.domain_size
    per_bit = np.array(list(itertools.product([False, True], repeat=observed)))
    keep, backstop = randomizer.fragment_keep, randomizer.backstop_keep
    log_one = _fragment_log_probabilities(per_bit, True, backstop, keep)
    log_zero = _fragment_log_probabilities(per_bit, False, backstop, keep)
    # Every output of the whole one-hot vector: one fragment pattern per bit.
    grid = np.array(list(itertools.product(range(per_bit.shape[0]), repeat=d)))
    reference = log_zero[grid].sum(axis=1)
    largest = 0.0
    for value in range(d):
        logs = np.where(np.arange(d) == value, log_one[grid], log_zero[grid]).sum(axis=1)
        largest = max(largest, _max_log_ratio(logs, reference))
    _assert_exact_epsilon(largest, randomizer.epsilon_for_fragments(observed))
    if observed == randomizer.fragments:
        _assert_exact_epsilon(largest, randomizer.epsilon_local)
    assert randomizer.ldp_kind == "removal"


def test_zero_sum_histogram_local_epsilon_is_infinite_and_central_delta_holds():
    randomizer = ZeroSumHistogram(domain_size=4, epsilon=0.8, delta=1e-4, respondents=3000)
    p = randomizer.p
    # Messages of bucket j from one respondent: x_j + Ber(p) copies.
    copies_if_held = np.array([0.0, 1 - p, p])
    copies_if_not = np.array([1 - p, p, 0.0])
    with np.errstate(divide="ignore"):
        ratios = np.log(copies_if_held) - np.log(copies_if_not)
    assert np.max(np.abs(ratios)) == math.inf == randomizer.epsilon_local
    # Central (Theorem 3.1 i): the count seen by the analyzer is c + Bin(n, p); neighbours differ by
    # one in c. The exact hockey-stick divergence at ε must stay within δ, in both directions.
    n = randomizer.respondents
    support = np.arange(n + 2)
    without = stats.binom.pmf(support, n, p)
    with_one = stats.binom.pmf(support - 1, n, p)
    factor = math.exp(randomizer.epsilon)
    for a, b in ((with_one, without), (without, with_one)):
        assert np.maximum(a - factor * b, 0).sum() <= randomizer.delta
    assert (randomizer.central_epsilon, randomizer.central_delta) == (1.6, 2e-4)


def _longitudinal_output_log_probabilities(client: LongitudinalClient, changes: np.ndarray):
    """Exact log P(h*, u_1..u_H) of Algorithm 1 for one change vector, outputs in a fixed order."""
    d, k, levels, keep = client.periods, client.max_changes, client.levels, client.node_keep
    change_times = np.flatnonzero(changes)
    logs = []
    for level in range(1, levels + 1):
        nodes = d >> (level - 1)
        patterns = np.array(list(itertools.product([-1, 1], repeat=nodes)))
        probability = np.zeros(patterns.shape[0])
        for chosen in range(k):
            held = np.zeros(nodes, dtype=int)
            if chosen < change_times.size:
                time = change_times[chosen]
                held[time >> (level - 1)] = changes[time]
            node_probability = np.where(held == 0, 0.5, np.where(patterns == held, keep, 1 - keep))
            probability += np.prod(node_probability, axis=1) / k
        logs.append(np.log(probability / levels))
    return np.concatenate(logs)


def test_longitudinal_epsilon_is_exact():
    """Theorem 5 over all change vectors x ∈ {-1, 0, 1}^d with at most k changes (d=4, k=2)."""
    client = LongitudinalClient(periods=4, max_changes=2, epsilon=1.2)
    inputs = [
        np.array(x) for x in itertools.product([-1, 0, 1], repeat=4) if np.count_nonzero(x) <= 2
    ]
    logs = [_longitudinal_output_log_probabilities(client, x) for x in inputs]
    for log in logs:
        assert np.exp(log).sum() == pytest.approx(1.0)
    largest = max(_max_log_ratio(a, b) for a, b in itertools.combinations(logs, 2))
    assert client.ldp_kind == "replacement"
    _assert_exact_epsilon(largest, client.epsilon_local)


# ----------------------------------------------------------------------------------------------
# randomize draws from the distribution the exact checks use
# ----------------------------------------------------------------------------------------------


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
        _longitudinal_output_log_probabilities(client, np.diff(path.astype(int), prepend=0))
    )
    assert _chi_square_p_value(observed, expected) > P_VALUE


# ----------------------------------------------------------------------------------------------
# Estimators: unbiased, standard errors match the spread
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Parameters, registry, validation
# ----------------------------------------------------------------------------------------------


EXAMPLES = [
    BinaryRandomizedResponse(1.0),
    OneHotRappor(10, 2.0),
    AsymmetricOneHot(10, 2.0),
    SymmetricOneHot(10, 2.0),
    CountMeanSketch(4, 64, 2.0, 5, 100),
    ZeroSumHistogram(10, 1.0, 1e-3, 1000),
    ReportFragmented(2.0, 1.0, 4, 10),
    LongitudinalClient(8, 2, 1.0),
]


def test_registry_round_trips_every_randomizer():
    assert set(RANDOMIZERS) == {
        "binary_rr", "one_hot_rappor", "asymmetric_one_hot", "symmetric_one_hot",
        "count_mean_sketch", "zero_sum_histogram", "report_fragmented", "longitudinal",
    }  # fmt: skip
    for randomizer in EXAMPLES:
        params = randomizer.to_params()
        assert all(isinstance(value, int | float) for value in params.values())
        assert build_randomizer(randomizer.name, params) == randomizer
        assert randomizer.payload_kind in {
            "bucket",
            "sketch",
            "signed_bucket",
            "fragment_bucket",
            "tree_node",
        }
    with pytest.raises(ValueError, match="unknown randomizer"):
        build_randomizer("nope", {})
    with pytest.raises(ValueError, match="missing"):
        build_randomizer("one_hot_rappor", {"epsilon": 1.0})


def test_expected_messages_per_respondent_matches_randomize():
    rng = seeded_generator(207)
    n = 4000
    for randomizer in EXAMPLES:
        if isinstance(randomizer, LongitudinalClient):
            values = np.zeros((n, randomizer.periods), dtype=bool)
            expected = randomizer.expected_messages_per_respondent()
        elif isinstance(randomizer, BinaryRandomizedResponse):
            values = rng.integers(0, 2, n)
            expected = randomizer.expected_messages_per_respondent(values.mean())
        else:
            values = rng.integers(0, randomizer.domain_size, n)
            expected = randomizer.expected_messages_per_respondent()
        batch = randomizer.randomize(values, rng)
        per_respondent = batch.messages_per_respondent(n)
        limit = Z * per_respondent.std() / math.sqrt(n) + 1e-9
        assert abs(per_respondent.mean() - expected) <= limit, randomizer.name


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: OneHotRappor(0, 1.0), "domain_size"),
        (lambda: OneHotRappor(5, -1.0), "epsilon"),
        (lambda: OneHotRappor(5, math.inf), "epsilon"),
        (lambda: CountMeanSketch(4, 100, 1.0, 0, 10), "width"),
        (lambda: ZeroSumHistogram(5, 1.0, 1e-3, 10), "respondents"),
        (lambda: ZeroSumHistogram(5, 2.0, 1e-3, 10_000), "epsilon"),
        (lambda: ReportFragmented(1.0, 1.0, 0, 5), "fragments"),
        (lambda: LongitudinalClient(6, 1, 1.0), "periods"),
        (lambda: BinaryRandomizedResponse(True), "epsilon"),
    ],
)
def test_bad_parameters_name_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_randomize_and_estimate_reject_bad_input():
    randomizer = OneHotRappor(5, 1.0)
    rng = seeded_generator(208)
    with pytest.raises(ValueError, match="values"):
        randomizer.randomize(np.array([0, 5]), rng)
    with pytest.raises(ValueError, match="values"):
        randomizer.randomize(np.array([0.5]), rng)
    with pytest.raises(ValueError, match="bucket_sums"):
        randomizer.estimate(np.zeros(4), 10)
    with pytest.raises(ValueError, match="true_counts"):
        randomizer.sample_bucket_sums(np.array([1, -1, 0, 0, 0]), rng)
    assert len(randomizer.randomize(np.empty(0, np.int64), rng)) == 0


def test_message_batch_validates_and_concatenates():
    def batch(respondent, bucket, fragment):
        size = len(respondent)
        return MessageBatch(
            np.array(respondent), np.array(bucket), np.ones(size, np.int8),
            np.full(size, fragment, np.int16), np.zeros(size, np.int32),
        )  # fmt: skip

    merged = MessageBatch.concatenate([batch([0, 2], [5, 6], 1), batch([0, 1], [7, 8], 2)])
    assert merged.respondent.tolist() == [0, 0, 1, 2]
    assert merged.fragment.tolist() == [1, 2, 2, 1]  # stable: fragment 1 first for respondent 0
    assert merged.bucket_sums(9).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert len(MessageBatch.empty()) == 0 and len(MessageBatch.concatenate([])) == 0
    with pytest.raises(ValueError, match="sorted"):
        batch([1, 0], [0, 0], 0)
    with pytest.raises(ValueError, match="sign"):
        MessageBatch(np.array([0]), np.array([0]), np.array([2]), np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="bucket has 2"):
        MessageBatch(np.array([0]), np.array([0, 1]), np.array([1]), np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="fragment"):
        MessageBatch(np.array([0]), np.array([0]), np.array([1]), np.array([40_000]), np.array([0]))
