"""Pure tests of the analyzer's accumulators and respondent weighting (no pipeline): BucketCounts,
CrowdAccumulator and effective_respondents."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from privacy.rng import seeded_generator
from transforms.analyzer.arithmetic import (
    BucketCounts,
    CrowdAccumulator,
    effective_respondents,
    merge_accumulators,
)


def _batches(seed: int, domain: int, sizes: list[int], signed: bool = False):
    rng = seeded_generator(seed)
    out = []
    for size in sizes:
        buckets = rng.integers(0, domain, size=size)
        weights = rng.choice(np.array([-1, 1]), size=size) if signed else None
        out.append((buckets, weights))
    return out


def _reference(domain: int, batches) -> np.ndarray:
    total = np.zeros(domain, dtype=np.int64)
    for buckets, weights in batches:
        np.add.at(total, buckets, 1 if weights is None else weights)
    return total


@pytest.mark.parametrize("dense_limit", [1 << 20, 0], ids=["dense", "sparse"])
@pytest.mark.parametrize("signed", [False, True], ids=["counts", "signed"])
def test_sequential_adds_per_batch_merges_and_compaction_agree(dense_limit, signed):
    # TFDV's habit: one batch at a time, merge of per-batch accumulators, and merge after
    # compaction/pickling must all give the same sums.
    domain = 5000
    batches = _batches(1, domain, [0, 1, 700, 3000, 20], signed=signed)
    expected = _reference(domain, batches)

    sequential = BucketCounts(domain, dense_limit)
    for buckets, weights in batches:
        sequential.add(buckets, weights)

    partials = []
    for buckets, weights in batches:
        partial = BucketCounts(domain, dense_limit)
        partial.add(buckets, weights)
        partials.append(pickle.loads(pickle.dumps(partial)))
    merged = partials[0]
    for partial in partials[1:]:
        merged.merge(partial)

    for counts in (sequential, merged):
        assert counts.is_dense == (dense_limit > 0)
        np.testing.assert_array_equal(counts.dense(), expected)
        keys, values = counts.sparse()
        np.testing.assert_array_equal(keys, np.flatnonzero(expected))
        np.testing.assert_array_equal(values, expected[keys])
        assert counts.total() == int(expected.sum())


def test_sparse_accumulator_compacts_and_holds_huge_domains(monkeypatch):
    from transforms.analyzer import arithmetic

    monkeypatch.setattr(arithmetic, "SPARSE_PENDING_LIMIT", 16)  # force many compactions
    domain = 1 << 40  # far too big to hold densely
    rng = seeded_generator(2)
    counts = BucketCounts(domain)
    assert not counts.is_dense
    hot = rng.integers(0, domain, size=50)
    seen = []
    for _ in range(30):
        buckets = hot[rng.integers(0, hot.size, size=40)]
        counts.add(buckets)
        seen.append(buckets)
    keys, values = counts.sparse()
    expected_keys, expected_values = np.unique(np.concatenate(seen), return_counts=True)
    np.testing.assert_array_equal(keys, expected_keys)
    np.testing.assert_array_equal(values, expected_values)
    with pytest.raises(ValueError, match="too large"):
        counts.dense()


def test_sparse_merges_into_dense():
    dense = BucketCounts(100)
    sparse = BucketCounts(100, dense_limit=0)
    sparse.add(np.array([3, 3, 99]))
    dense.add(np.array([3, 0]))
    dense.merge(sparse)
    expected = np.zeros(100, dtype=np.int64)
    expected[[0, 3, 99]] = [1, 3, 1]
    np.testing.assert_array_equal(dense.dense(), expected)


@pytest.mark.parametrize(
    ("buckets", "weights", "message"),
    [
        (np.array([0, 10]), None, r"buckets must lie in \[0, 10\)"),
        (np.array([-1]), None, "buckets must lie"),
        (np.array([0.5]), None, "buckets must be integers"),
        (np.array([[1]]), None, "1-D"),
        (np.array([1, 2]), np.array([1]), "weights shape"),
        (np.array([1]), np.array([0.5]), "weights must be integers"),
    ],
)
def test_bucket_counts_rejects_bad_input(buckets, weights, message):
    with pytest.raises(ValueError, match=message):
        BucketCounts(10).add(buckets, weights)


def test_bucket_counts_rejects_bad_domain_and_mismatched_merge():
    with pytest.raises(ValueError, match="domain_size"):
        BucketCounts(0)
    with pytest.raises(ValueError, match="cannot merge"):
        BucketCounts(10).merge(BucketCounts(11))


def test_crowd_accumulators_merge_counts_respondents_and_rejections():
    first = CrowdAccumulator.empty(8)
    first.add_messages(np.array([1, 2, 2]))
    first.set_respondents(0, 5)
    first.add_rejected("crc_mismatch", 2)
    second = CrowdAccumulator.empty(8)
    second.add_messages(np.array([7]))
    second.set_respondents(1, 4)
    second.add_rejected("crc_mismatch", 1)
    second.add_rejected("bad_payload", 1)
    merged = merge_accumulators([first, second])
    np.testing.assert_array_equal(merged.counts.dense(), [0, 1, 2, 0, 0, 0, 0, 1])
    assert merged.respondents == {0: 5, 1: 4}
    assert merged.messages == 4
    assert merged.rejected == {"crc_mismatch": 3, "bad_payload": 1}
    # Inputs are untouched; an instance's count is stated once, never summed.
    assert first.respondents == {0: 5} and first.messages == 3
    np.testing.assert_array_equal(first.counts.dense(), [0, 1, 2, 0, 0, 0, 0, 0])
    again = CrowdAccumulator.empty(8)
    again.set_respondents(0, 1)
    with pytest.raises(ValueError, match="stated twice"):
        merge_accumulators([first, again])


def test_effective_respondents_is_the_weighted_respondents_released():
    assert effective_respondents({0: 1000, 1: 1000}, [0.5, 0.5]) == 1000
    # Instance 1 deleted 100 respondents: only its share of messages went missing.
    assert effective_respondents({0: 1000, 1: 900}, [0.25, 0.75]) == pytest.approx(925)
    # Instance 1 withheld the crowd: no count there, n_eff is instance 0's share.
    assert effective_respondents({0: 1000}, [0.5, 0.5]) == 500


def test_effective_respondents_keeps_estimates_unbiased_under_deletion():
    # Simulate the protocol: each respondent's message goes to instance u ~ π; instance 1 drops
    # a set of respondents (their messages; its commit record states the survivors). Sum of surviving messages divided
    # by n_eff estimates the surviving population's mean with no bias.
    rng = seeded_generator(3)
    n, weights = 200_000, np.array([0.3, 0.7])
    values = rng.random(n) < 0.4  # one bit per respondent, sent only when set
    instance = rng.choice(2, size=n, p=weights)
    deleted_in_1 = rng.random(n) < 0.2
    alive = ~((instance == 1) & deleted_in_1)
    respondents = {0: n, 1: int(n - deleted_in_1.sum())}
    n_eff = effective_respondents(respondents, weights)
    estimate = values[alive].sum() / n_eff
    # Target: π-weighted survivor mean; the deletion is independent of values, so that is 0.4 in
    # expectation. Std of the ratio ~ sqrt(0.4*0.6/n) ≈ 0.0011; 5 sigma: ~6e-7 false failures.
    target = (weights[0] * values.sum() + weights[1] * values[~deleted_in_1].sum()) / n_eff
    assert abs(estimate - target) < 5 * np.sqrt(0.4 * 0.6 / n)


@pytest.mark.parametrize(
    ("respondents", "weights", "message"),
    [
        ({0: 1}, [0.5, 0.6], "sum to 1"),
        ({0: 1}, [], "non-empty"),
        ({2: 1}, [0.5, 0.5], "2 instances"),
        ({0: -1}, [1.0], "negative"),
    ],
)
def test_effective_respondents_rejects_bad_input(respondents, weights, message):
    with pytest.raises(ValueError, match=message):
        effective_respondents(respondents, weights)
