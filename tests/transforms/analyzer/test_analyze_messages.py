"""Pure tests of the analyzer's decoding of shuffled-message batches (dead letters, tree-node
periods, longitudinal windows) and of respondent counting from commit records only."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from privacy.rng import seeded_generator
from schemas.payloads import EncodedPayloads, encode_payloads
from tests.transforms.analyzer.analyzer_messages import (
    BOOK,
    CENSUS_BYTES,
    DAY,
    ONE_HOT,
    T0,
    TREE,
    bucket_payload,
    commit_crowd,
    message_batch,
)
from transforms.analyzer.arithmetic import (
    HISTOGRAM,
    LONGITUDINAL,
    TREE_NODE_MISMATCH,
    LongitudinalAccumulator,
    aggregate_batch,
    estimate_histogram,
    estimate_longitudinal,
    merge_any,
    payloads_subset,
    respondent_accumulators,
    tree_node_matches_period,
)

# ---------------------------------------------------------------------------------------------
# Batches of shuffled messages
# ---------------------------------------------------------------------------------------------


def test_aggregate_batch_counts_crowds_and_dead_letters_every_bad_message():
    good = [(T0, "onehot", "onehot@1", None, CENSUS_BYTES)] * 3 + [
        (T0, "onehot", "onehot@1", None, bucket_payload(b)) for b in (0, 5, 5, 15)
    ]
    other_crowd = [
        (T0, "onehot", "onehot@1", "en-US", CENSUS_BYTES),
        (T0, "onehot", "onehot@1", "en-US", bucket_payload(1)),
    ]
    bad = [
        (T0, "onehot", "onehot@1", None, bucket_payload(2), 12345),  # crc_mismatch
        (T0, "onehot", "nobody@1", None, bucket_payload(2)),  # unknown_recipe
        (T0, "tree", "onehot@1", None, bucket_payload(2)),  # recipe_channel_mismatch
        (T0, "onehot", "onehot@1", None, bucket_payload(16)),  # value_out_of_range (domain 16)
        (T0, "onehot", "onehot@1", None, b""),  # empty
        (T0, "onehot", "onehot@1", None, bucket_payload(3), None, 99),  # unknown_schema_version
        (
            T0,
            "onehot",
            "onehot@1",
            None,
            encode_payloads("sketch", {"row": [0], "column": [1]}).to_list()[0],
        ),
    ]
    rows = good + bad + other_crowd
    result = aggregate_batch(message_batch(rows), BOOK, {1})

    key = (HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", None)
    accumulator = result.accumulators[key]
    expected = np.zeros(16, dtype=np.int64)
    expected[[0, 5, 15]] = [1, 2, 1]
    np.testing.assert_array_equal(accumulator.counts.dense(), expected)
    assert accumulator.respondents == {}  # n never comes from messages
    assert accumulator.messages == 4
    other = result.accumulators[(HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", "en-US")]
    assert other.respondents == {} and other.messages == 1

    reasons = dict(zip(result.rejected_rows.tolist(), result.rejected_reasons, strict=True))
    first_bad = len(good)
    assert [reasons[first_bad + i] for i in range(len(bad))] == [
        "crc_mismatch",
        "unknown_recipe",
        "recipe_channel_mismatch",
        "value_out_of_range",
        "empty",
        "unknown_schema_version",
        "unexpected_kind",
    ]
    census_rows = [i for i, row in enumerate(good + bad + other_crowd) if row[4] == CENSUS_BYTES]
    assert all(reasons[i] == "census_not_counted" for i in census_rows)
    counts = result.counts
    rejected = sum(v for k, v in counts.items() if k.startswith("rejected:"))
    assert counts["read"] == len(rows) == counts["messages"] + rejected
    assert (counts["messages"], rejected) == (5, len(bad) + 4)
    assert counts["rejected:census_not_counted"] == 4


def test_aggregate_batch_checks_recipes_per_pair_of_recipe_and_channel():
    """Null recipe IDs and channels, and one recipe ID named on several channels, each crowd
    judged by its own (recipe ID, channel) pair; the counted crowds' accumulators as before."""
    rows = [
        (T0, "onehot", None, "a", bucket_payload(1)),  # no recipe ID: unknown_recipe
        (T0, None, "onehot@1", "b", bucket_payload(2)),  # no channel: recipe_channel_mismatch
        (T0, "tree", "onehot@1", "c", bucket_payload(3)),  # another recipe's channel
        (T0, "onehot", "onehot@1", "d", bucket_payload(4)),
        (T0, "onehot", "nobody@1", "e", bucket_payload(5)),  # unknown_recipe
        (T0, "onehot", "onehot@1", "b", bucket_payload(6)),  # crowd b on its right channel
        (T0, None, None, "f", bucket_payload(7)),  # neither: unknown_recipe
    ]
    result = aggregate_batch(message_batch(rows), BOOK, {1})
    reasons = dict(zip(result.rejected_rows.tolist(), result.rejected_reasons, strict=True))
    assert reasons == {
        0: "unknown_recipe",
        1: "recipe_channel_mismatch",
        2: "recipe_channel_mismatch",
        4: "unknown_recipe",
        6: "unknown_recipe",
    }
    counted = {
        key[5]: acc.counts.dense().nonzero()[0].tolist() for key, acc in result.accumulators.items()
    }
    assert counted == {"d": [4], "b": [6]}


def test_aggregate_batch_rejects_a_batch_without_the_message_columns():
    batch = pa.RecordBatch.from_pydict({"payload": [b"x", b"y"]})
    result = aggregate_batch(batch, BOOK, {1})
    assert result.rejected_reasons == ["missing_field", "missing_field"]
    assert result.accumulators == {}


def test_payloads_subset_picks_the_same_bytes():
    payloads = EncodedPayloads.from_list([b"a", b"", b"bcd", b"ef"])
    subset = payloads_subset(payloads, np.array([3, 0, 2]))
    assert subset.to_list() == [b"ef", b"a", b"bcd"]


def _longitudinal_batches(states: np.ndarray, instance_of: np.ndarray, rng):
    """Tree-node messages of LongitudinalClient, one batch per (period window, instance)."""
    client = TREE.build_randomizer()
    messages = client.randomize(states, rng)
    batches = []
    for period in range(1, client.periods + 1):
        start = T0 + (period - 1) * DAY
        for instance in (0, 1):
            chosen = (messages.period == period) & (instance_of[messages.respondent] == instance)
            payloads = encode_payloads(
                "tree_node",
                {
                    "period": messages.period[chosen],
                    "node": messages.bucket[chosen],
                    "sign": messages.sign[chosen],
                },
            ).to_list()
            rows = [(start, "tree", "tree@1", None, p) for p in payloads]
            batches.append((instance, start, message_batch(rows)))
    return messages, batches


def test_longitudinal_messages_across_windows_give_algorithm_2_marginals():
    rng = seeded_generator(5)
    n = 3000
    client = TREE.build_randomizer()
    states = np.zeros((n, client.periods), dtype=bool)
    switch_on = rng.integers(1, client.periods + 1, size=n)
    states[np.arange(client.periods)[None, :] >= (switch_on[:, None] - 1)] = True
    # The randomizer sends each message to one instance; both commit records state n per window.
    messages, batches = _longitudinal_batches(states, rng.integers(0, 2, size=n), rng)
    assert tree_node_matches_period(messages.bucket, messages.period, client.periods).all()
    partials = [aggregate_batch(batch, BOOK, {1}) for _, _, batch in batches]
    assert all(not p.rejected_reasons for p in partials)
    stated = [
        accumulator
        for instance, start, _ in batches
        for _, accumulator in respondent_accumulators(
            [commit_crowd(start, "tree", n)], instance, BOOK
        )
    ]
    accumulator = merge_any([acc for p in partials for acc in p.accumulators.values()] + stated)
    key = (LONGITUDINAL, 0, DAY, "tree", "tree@1", None)
    [result] = estimate_longitudinal(TREE, key, accumulator, failure_probability=1e-3)
    direct = client.estimate(messages.bucket_sums(client.message_domain_size), n)
    # Nothing deleted: n_eff = n in every period, so the marginals are Algorithm 2's exactly.
    np.testing.assert_allclose(result.estimate, direct.estimate)
    np.testing.assert_allclose(result.respondents_per_period, n)
    assert result.round_start == T0 and result.window_ms == DAY
    # Theorem 6 with explicit constants: P(max_t |error| > bound) <= 1e-3 (false-failure rate).
    assert np.abs(result.estimate - states.sum(axis=0)).max() <= result.bound


def test_tree_nodes_reported_in_the_wrong_period_are_rejected():
    start = T0 + 2 * DAY  # period 3
    node_of_period_4 = encode_payloads(
        "tree_node", {"period": [3], "node": [8 + 1], "sign": [1]}
    ).to_list()[0]  # node [2, 2] belongs to t = 4, not 3
    result = aggregate_batch(
        message_batch([(start, "tree", "tree@1", None, node_of_period_4)]), BOOK, {1}
    )
    assert result.rejected_reasons == [TREE_NODE_MISMATCH]


def test_periods_lost_to_deletion_are_rescaled_to_stay_unbiased():
    # Instance 1 deletes half its respondents in period 2's window: the nodes of that window
    # lose half of instance 1's messages on average and are scaled up by n / n_eff_2.
    client = TREE.build_randomizer()
    accumulator = LongitudinalAccumulator(client.message_domain_size, DAY)
    for period in range(1, client.periods + 1):
        for instance in (0, 1):
            count = 100 if (period, instance) != (2, 1) else 50
            accumulator.set_respondents(T0 + (period - 1) * DAY, instance, count)
    node = np.array([1])  # node [1, 2]: reported at period 2
    accumulator.add_messages(T0, node, np.array([1]))
    [result] = estimate_longitudinal(
        TREE, (LONGITUDINAL, 0, DAY, "tree", "tree@1", None), accumulator
    )
    assert result.respondents == 100
    np.testing.assert_allclose(result.respondents_per_period[1], 75)
    unscaled = client.estimate(np.eye(client.message_domain_size)[1], 100).estimate
    np.testing.assert_allclose(result.estimate, unscaled * 100 / 75)


# ---------------------------------------------------------------------------------------------
# n comes from the commit records only
# ---------------------------------------------------------------------------------------------


def _n_eff_of(partials, crowds_by_instance):
    """n_eff of the one histogram crowd, from decoded batches plus commit records."""
    stated = [
        accumulator
        for instance, crowds in crowds_by_instance.items()
        for _, accumulator in respondent_accumulators(crowds, instance, BOOK)
    ]
    accumulator = merge_any([acc for p in partials for acc in p.accumulators.values()] + stated)
    key = (HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", None)
    return estimate_histogram(ONE_HOT, key, accumulator).respondents


def test_a_flood_of_messages_from_one_origin_cannot_change_n():
    commits = {0: [commit_crowd(T0, "onehot", 101)], 1: [commit_crowd(T0, "onehot", 99)]}
    honest = [(T0, "onehot", "onehot@1", None, bucket_payload(b)) for b in range(16)]
    baseline = _n_eff_of([aggregate_batch(message_batch(honest), BOOK, {1})], commits)
    assert baseline == pytest.approx(0.5 * 101 + 0.5 * 99)
    # One device floods the release with retired census payloads and data messages.
    flood = honest + [(T0, "onehot", "onehot@1", None, CENSUS_BYTES)] * 10_000
    flood += [(T0, "onehot", "onehot@1", None, bucket_payload(3))] * 5_000
    flooded = aggregate_batch(message_batch(flood), BOOK, {1})
    assert flooded.counts["rejected:census_not_counted"] == 10_000
    assert _n_eff_of([flooded], commits) == baseline


def test_respondent_accumulators_take_released_crowds_of_known_recipes_only():
    crowds = [
        commit_crowd(T0, "onehot", 300),
        commit_crowd(T0 + DAY, "onehot", None),  # withheld: no count, no accumulator
        {**commit_crowd(T0, "onehot", 7), "recipe_id": "nobody@1"},  # unknown recipe: skipped
        commit_crowd(T0, "tree", 40),
    ]
    out = dict(respondent_accumulators(crowds, 1, BOOK))
    assert out[(HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", None)].respondents == {1: 300}
    assert out[(LONGITUDINAL, 0, DAY, "tree", "tree@1", None)].respondents == {(T0, 1): 40}
    assert len(out) == 2
    for bad in (-1, True, 2.5, None):
        crowd = {**commit_crowd(T0, "onehot", 1), "respondents_released": bad}
        with pytest.raises(ValueError, match="respondents_released"):
            respondent_accumulators([crowd], 0, BOOK)


def test_histogram_crowds_counted_as_rows_equal_crowd_by_crowd_counting():
    """aggregate_batch counts the histogram crowds of small dense domains of a batch together
    (one bincount over crowd x bucket per recipe); with a dense limit of 0 every crowd is
    counted alone into sparse sums. A shuffled batch of every shipped small recipe (fragments,
    sketches, zero-sum signs), longitudinal rounds, census payloads, bad CRCs, unknown recipes,
    wrong channels and undecodable payloads gives the same sums, messages, dead letters and
    counters both ways."""
    from schemas.payloads import encode_message_batch
    from schemas.recipes import load_recipe
    from transforms.analyzer.arithmetic import CrowdAccumulator, RecipeBook

    names = ["small_asymmetric_one_hot", "small_binary_rr", "small_count_mean_sketch",
             "small_one_hot_rappor", "small_report_fragmented", "small_zero_sum_histogram"]  # fmt: skip
    recipes = [load_recipe(name) for name in names]
    book = RecipeBook([*recipes, TREE])
    rng = seeded_generator(11)
    rows = []
    for recipe in recipes:
        randomizer = recipe.build_randomizer()
        for crowd in range(12):
            values = rng.integers(0, randomizer.domain_size, size=int(rng.integers(1, 6)))
            messages = randomizer.randomize(values, rng)
            width = getattr(randomizer, "width", None)
            payloads = encode_message_batch(messages, recipe.payload_kind, width).to_list()
            start = T0 + (crowd % 3) * DAY
            crowd_id = None if crowd == 0 else f"c{crowd}"
            rows += [(start, recipe.channel, recipe.id, crowd_id, p) for p in payloads]
    tree = TREE.build_randomizer()
    states = np.arange(tree.periods)[np.newaxis, :] >= rng.integers(0, tree.periods, size=(4, 1))
    for payload in encode_message_batch(tree.randomize(states, rng), "tree_node").to_list():
        rows.append((T0, TREE.channel, TREE.id, "t", payload))
    one_hot = recipes[3]
    rows += [
        (T0, one_hot.channel, one_hot.id, "c1", CENSUS_BYTES),
        (T0, one_hot.channel, one_hot.id, "c1", bucket_payload(1), 12345),
        (T0, one_hot.channel, "nobody@1", "c1", bucket_payload(1)),
        (T0, recipes[0].channel, one_hot.id, "c2", bucket_payload(1)),
        (T0, one_hot.channel, one_hot.id, "c2", b"\xff"),
        (T0, one_hot.channel, one_hot.id, "bad only", b""),
    ]
    order = rng.permutation(len(rows))
    batch = message_batch([rows[i] for i in order])
    together = aggregate_batch(batch, book, {1})
    alone = aggregate_batch(batch, book, {1}, dense_limit=0)
    assert list(together.accumulators) == list(alone.accumulators)
    assert together.counts == alone.counts and together.counts["messages"] > 300
    np.testing.assert_array_equal(together.rejected_rows, alone.rejected_rows)
    assert together.rejected_reasons == alone.rejected_reasons
    assert len(together.rejected_reasons) >= 5
    as_rows = histograms = 0
    for key, accumulator in together.accumulators.items():
        other = alone.accumulators[key]
        assert accumulator.messages == other.messages and accumulator.rejected == other.rejected
        if isinstance(accumulator, CrowdAccumulator):
            as_rows += accumulator.counts.is_dense
            histograms += 1
            assert not other.counts.is_dense
            sums, expected = accumulator.counts.sparse(), other.counts.sparse()
            np.testing.assert_array_equal(sums[0], expected[0])
            np.testing.assert_array_equal(sums[1], expected[1])
        else:
            assert {s: c.dense().tolist() for s, c in accumulator.nodes.items()} == {
                s: c.dense().tolist() for s, c in other.nodes.items()
            }
    assert as_rows == histograms > 60  # every histogram crowd counted as a row
