"""Randomizer parameters, the registry that rebuilds them, and validation of bad parameters and
input."""

from __future__ import annotations

import math

import numpy as np
import pytest

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
from tests.privacy.randomizer_references import Z

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
