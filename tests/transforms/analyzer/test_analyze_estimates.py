"""Pure tests of the analyzer's estimates, accuracy, privacy summaries and withheld-crowd notes."""

from __future__ import annotations

import numpy as np
import pytest

from privacy.accounting import BOUND_DESCRIPTIONS
from privacy.rng import seeded_generator
from schemas.recipes import load_recipe
from tests.transforms.analyzer.analyzer_messages import DAY, ONE_HOT, T0, TREE, recipe_of
from transforms.analyzer.arithmetic import (
    HISTOGRAM,
    CrowdAccumulator,
    estimate_histogram,
    histogram_accuracy,
    missing_instance_note,
    privacy_summary,
    withheld_notes,
)


def _onehot_accumulator(dense_limit: int, seed: int = 7):
    rng = seeded_generator(seed)
    randomizer = ONE_HOT.build_randomizer()
    values = rng.integers(0, 4, size=2000)  # buckets 4..15 hold nobody
    messages = randomizer.randomize(values, rng)
    accumulator = CrowdAccumulator.empty(16, dense_limit)
    accumulator.add_messages(messages.bucket)
    accumulator.set_respondents(0, 2000)
    accumulator.set_respondents(1, 2000)
    return accumulator, values


def test_sparse_estimates_equal_the_dense_ones():
    key = (HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", None)
    dense_acc, values = _onehot_accumulator(1 << 20)
    sparse_acc, _ = _onehot_accumulator(0)
    dense = estimate_histogram(ONE_HOT, key, dense_acc, "norm_sub")
    sparse = estimate_histogram(ONE_HOT, key, sparse_acc)
    assert dense.dense and not sparse.dense
    assert dense.postprocessing == "norm_sub" and dense.postprocessed.sum() == pytest.approx(2000)
    np.testing.assert_allclose(sparse.estimate, dense.estimate[sparse.buckets])
    np.testing.assert_allclose(sparse.stderr, dense.stderr[sparse.buckets])
    unobserved = np.setdiff1d(np.arange(16), sparse.buckets)
    np.testing.assert_allclose(dense.estimate[unobserved], sparse.unobserved_estimate)
    buckets, counts = np.unique(values, return_counts=True)
    dense_accuracy = histogram_accuracy(dense, buckets, counts)
    sparse_accuracy = histogram_accuracy(sparse, buckets, counts)
    for name in ("rmse", "stderr_rms", "truth_scale"):
        assert sparse_accuracy[name] == pytest.approx(dense_accuracy[name])
    assert dense_accuracy["truth_scale"] == 1.0


def test_estimates_use_the_weighted_respondents_of_the_instances_that_released():
    accumulator, _ = _onehot_accumulator(1 << 20)
    accumulator.respondents = {0: 2000}  # instance 1 withheld the crowd
    key = (HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", None)
    result = estimate_histogram(ONE_HOT, key, accumulator)
    assert result.respondents == 1000
    assert "released nothing" in missing_instance_note(ONE_HOT, result.respondents_by_instance)
    assert missing_instance_note(ONE_HOT, {0: 5, 1: 5}) is None
    accumulator.respondents = {}
    with pytest.raises(ValueError, match="no commit record"):
        estimate_histogram(ONE_HOT, key, accumulator)


def test_privacy_summary_states_the_bound_and_adds_deletion_per_instance():
    plain = privacy_summary(ONE_HOT, {0: 50_000, 1: 60_000})
    assert plain["respondents"] == 50_000  # the smaller instance bounds amplification
    assert plain["epsilon_local_all"] == plain["epsilon_local_one"] == 2.0
    assert plain["bound"] in BOUND_DESCRIPTIONS and plain["bound"] != "local"
    assert plain["epsilon_central"] < 2.0
    assert plain["epsilon_central_without_attribute_fragmentation"] >= plain["epsilon_central"]
    assert any("no randomized deletion" in note for note in plain["notes"])
    deleted = privacy_summary(ONE_HOT, {0: 50_000, 1: 60_000}, {0: (0.5, 1e-8), 1: (0.25, 1e-8)})
    assert deleted["epsilon_central_total"] == pytest.approx(plain["epsilon_central"] + 0.75)
    assert deleted["delta_total"] == pytest.approx(1e-6 + 2e-8)
    nobody = privacy_summary(ONE_HOT, {})
    assert nobody["epsilon_central"] is None


def test_privacy_summary_states_the_solved_epsilon_local_beside_the_achieved_one():
    sealed = load_recipe("image_grid_sealed")
    summary = privacy_summary(sealed, {0: 40_000, 1: 40_000})
    assert summary["epsilon_local_solved"] == {
        "epsilon_local": sealed.epsilon_local,
        "epsilon_central_target": 0.7,
        "expected_crowd": 40_000,
        "bound": "variation_ratio",
    }
    assert summary["epsilon_central"] <= 0.7  # achieved at the expected crowd
    assert privacy_summary(sealed, {0: 80_000, 1: 80_000})["epsilon_central"] < 0.5
    assert "epsilon_local_solved" not in privacy_summary(ONE_HOT, {0: 50_000})


def test_privacy_summary_of_report_fragments_zero_sum_and_longitudinal():
    fragmented = recipe_of(
        "frag", "report_fragmented",
        {"backstop_epsilon": 4.0, "fragment_epsilon": 1.5, "fragments": 3, "domain_size": 16},
        fragmentation={"report": {"tau": 3, "epsilon_backstop": 4.0, "epsilon_fragment": 1.5}},
    )  # fmt: skip
    report = privacy_summary(fragmented, {0: 100_000, 1: 100_000})
    randomizer = fragmented.build_randomizer()
    assert report["epsilon_local_all"] == pytest.approx(randomizer.epsilon_local)
    assert report["epsilon_local_one"] == pytest.approx(randomizer.epsilon_single_fragment)
    assert report["epsilon_local_one"] < report["epsilon_local_all"]

    zero_sum = recipe_of(
        "zs", "zero_sum_histogram",
        {"domain_size": 8, "epsilon": 0.5, "delta": 1e-7, "respondents": 10_000},
        min_crowd_size=10_000, delta=2e-7, shuffler_instances=1, epsilon_central_target=1.0,
    )  # fmt: skip
    assert privacy_summary(zero_sum, {0: 10_000})["epsilon_central"] == pytest.approx(1.0)
    small = privacy_summary(zero_sum, {0: 9_999})
    assert small["epsilon_central"] is None and "calibrated" in small["notes"][0]

    tree = privacy_summary(TREE, {0: 100_000, 1: 100_000})
    assert tree["epsilon_central"] <= 1.0 and tree["epsilon_local_all"] == 1.0
    assert any("per period" in note for note in tree["notes"])


def test_withheld_notes_say_which_crowds_have_no_estimate():
    def crowd(instance, channel, crowd_id, status):
        return {"window_start_ms": T0, "window_end_ms": T0 + DAY, "channel": channel,
                "recipe_id": f"{channel}@1", "crowd_id": crowd_id, "status": status,
                "respondents_released": None if status == "withheld" else 500,
                "messages_released": 0, "instance": instance}  # fmt: skip

    crowds = [
        crowd(0, "a", None, "withheld"),
        crowd(1, "a", None, "withheld"),
        crowd(1, "b", "x", "withheld"),
        crowd(0, "b", "x", "released"),
    ]
    notes = withheld_notes(crowds, {(T0, "b", "b@1", "x")})
    by_channel = {note["channel"]: note for note in notes}
    assert by_channel["a"]["withheld_by"] == [0, 1]
    assert not by_channel["a"]["estimated"] and "no estimate" in by_channel["a"]["note"]
    assert by_channel["b"]["estimated"] and by_channel["b"]["withheld_by"] == [1]


def test_sketch_counts_kept_sparsely_are_expanded_for_the_sketch_estimator():
    sketch = recipe_of(
        "cms", "count_mean_sketch",
        {"num_hashes": 4, "width": 64, "epsilon": 4.0, "hash_seed": 3, "domain_size": 500},
    )  # fmt: skip
    randomizer = sketch.build_randomizer()
    rng = seeded_generator(9)
    messages = randomizer.randomize(rng.integers(0, 20, size=3000), rng)
    key = (HISTOGRAM, T0, T0 + DAY, "cms", "cms@1", None)
    results = []
    for dense_limit in (1 << 20, 0):
        accumulator = CrowdAccumulator.empty(randomizer.message_domain_size, dense_limit)
        accumulator.add_messages(messages.bucket)
        accumulator.set_respondents(0, 3000)
        accumulator.set_respondents(1, 3000)
        results.append(estimate_histogram(sketch, key, accumulator))
    dense, expanded = results
    assert dense.domain_size == expanded.domain_size == 500
    assert dense.raw_count is None  # estimates are per value, sums per sketch cell
    np.testing.assert_array_equal(dense.estimate, expanded.estimate)
    direct = randomizer.estimate(messages.bucket_sums(randomizer.message_domain_size), 3000)
    np.testing.assert_allclose(dense.estimate, direct.estimate)
