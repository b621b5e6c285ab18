"""Exact-ε tests of the local randomizers: enumerate every output of a small instance and compute
likelihoods from the randomizer's per-bit (per-node) probabilities; the worst log-ratio must be
ε to double precision."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

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
from tests.privacy.randomizer_references import longitudinal_output_log_probabilities


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


def test_longitudinal_epsilon_is_exact():
    """Theorem 5 over all change vectors x ∈ {-1, 0, 1}^d with at most k changes (d=4, k=2)."""
    client = LongitudinalClient(periods=4, max_changes=2, epsilon=1.2)
    inputs = [
        np.array(x) for x in itertools.product([-1, 0, 1], repeat=4) if np.count_nonzero(x) <= 2
    ]
    logs = [longitudinal_output_log_probabilities(client, x) for x in inputs]
    for log in logs:
        assert np.exp(log).sum() == pytest.approx(1.0)
    largest = max(_max_log_ratio(a, b) for a, b in itertools.combinations(logs, 2))
    assert client.ldp_kind == "replacement"
    _assert_exact_epsilon(largest, client.epsilon_local)
