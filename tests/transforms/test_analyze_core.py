"""Pure tests of the analyzer's accumulators and respondent counting (no pipeline)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pyarrow as pa
import pytest

from privacy.accounting import BOUND_DESCRIPTIONS
from privacy.randomizers import build_randomizer
from privacy.rng import seeded_generator
from schemas import crc32c
from schemas.payloads import CENSUS, EncodedPayloads, encode_payloads
from schemas.recipes import Recipe, load_recipe, recipe_from_dict
from transforms.analyze_core import (
    HISTOGRAM,
    LONGITUDINAL,
    MESSAGE_COLUMNS,
    TREE_NODE_MISMATCH,
    BucketCounts,
    CrowdAccumulator,
    LongitudinalAccumulator,
    RecipeBook,
    aggregate_batch,
    effective_respondents,
    estimate_histogram,
    estimate_longitudinal,
    histogram_accuracy,
    merge_accumulators,
    merge_any,
    missing_instance_note,
    payloads_subset,
    privacy_summary,
    respondent_accumulators,
    tree_node_matches_period,
    withheld_notes,
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
    import transforms.analyze_core as core

    monkeypatch.setattr(core, "SPARSE_PENDING_LIMIT", 16)  # force many compactions
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


# ---------------------------------------------------------------------------------------------
# Batches of shuffled messages
# ---------------------------------------------------------------------------------------------

DAY = 86_400_000
T0 = 1_704_067_200_000  # 2024-01-01


def _recipe(name: str, randomizer: str, params: dict, **extra) -> Recipe:
    built = build_randomizer(randomizer, params)
    data = {
        "name": name,
        "version": 1,
        "channel": extra.pop("channel", name),
        "randomizer": randomizer,
        "randomizer_params": params,
        "fragmentation": "attribute",
        "epsilon_local": None if math.isinf(built.epsilon_local) else built.epsilon_local,
        "epsilon_central_target": 4.0,
        "delta": 1e-6,
        "min_crowd_size": 10,
        "query_class": "test",
        "data_fields": ["value"],
        "shuffler_instances": 2,
    }
    data.update(extra)
    return recipe_from_dict(data)


ONE_HOT = _recipe("onehot", "one_hot_rappor", {"domain_size": 16, "epsilon": 2.0})
TREE = _recipe("tree", "longitudinal", {"periods": 8, "max_changes": 2, "epsilon": 1.0})
BOOK = RecipeBook([ONE_HOT, TREE])


def _batch(rows: list[tuple]) -> pa.RecordBatch:
    """ShuffledMessage rows (window_start, channel, recipe_id, crowd_id, payload[, crc[, version]])
    with a correct CRC unless one is given."""
    columns: dict[str, list] = {name: [] for name in MESSAGE_COLUMNS}
    for row in rows:
        start, channel, recipe_id, crowd_id, payload = row[:5]
        crc = row[5] if len(row) > 5 and row[5] is not None else crc32c(payload)
        version = row[6] if len(row) > 6 else 1
        for name, value in zip(
            MESSAGE_COLUMNS,
            (version, start, start + DAY, channel, recipe_id, crowd_id, payload, crc),
            strict=True,
        ):
            columns[name].append(value)
    return pa.RecordBatch.from_pydict(
        columns,
        schema=pa.schema(
            [
                ("schema_version", pa.int32()),
                ("window_start", pa.int64()),
                ("window_end", pa.int64()),
                ("channel", pa.string()),
                ("recipe_id", pa.string()),
                ("crowd_id", pa.string()),
                ("payload", pa.binary()),
                ("payload_crc32c", pa.int64()),
            ]
        ),
    )


def _crowd(start: int, channel: str, respondents: int | None, crowd_id=None) -> dict:
    """One crowd of a commit record (schemas/release.py format)."""
    return {
        "window_start_ms": start,
        "window_end_ms": start + DAY,
        "channel": channel,
        "recipe_id": f"{channel}@1",
        "crowd_id": crowd_id,
        "status": "withheld" if respondents is None else "released",
        "respondents_released": respondents,
        "messages_released": 0,
    }


def _bucket(value: int) -> bytes:
    return encode_payloads("bucket", {"bucket": np.array([value])}).to_list()[0]


CENSUS_BYTES = encode_payloads(CENSUS, {}, count=1).to_list()[0]  # retired census payload


def test_aggregate_batch_counts_crowds_and_dead_letters_every_bad_message():
    good = [(T0, "onehot", "onehot@1", None, CENSUS_BYTES)] * 3 + [
        (T0, "onehot", "onehot@1", None, _bucket(b)) for b in (0, 5, 5, 15)
    ]
    other_crowd = [
        (T0, "onehot", "onehot@1", "en-US", CENSUS_BYTES),
        (T0, "onehot", "onehot@1", "en-US", _bucket(1)),
    ]
    bad = [
        (T0, "onehot", "onehot@1", None, _bucket(2), 12345),  # crc_mismatch
        (T0, "onehot", "nobody@1", None, _bucket(2)),  # unknown_recipe
        (T0, "tree", "onehot@1", None, _bucket(2)),  # recipe_channel_mismatch
        (T0, "onehot", "onehot@1", None, _bucket(16)),  # value_out_of_range (domain 16)
        (T0, "onehot", "onehot@1", None, b""),  # empty
        (T0, "onehot", "onehot@1", None, _bucket(3), None, 99),  # unknown_schema_version
        (
            T0,
            "onehot",
            "onehot@1",
            None,
            encode_payloads("sketch", {"row": [0], "column": [1]}).to_list()[0],
        ),
    ]
    rows = good + bad + other_crowd
    result = aggregate_batch(_batch(rows), BOOK, {1})

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
            batches.append((instance, start, _batch(rows)))
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
        for _, accumulator in respondent_accumulators([_crowd(start, "tree", n)], instance, BOOK)
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
    result = aggregate_batch(_batch([(start, "tree", "tree@1", None, node_of_period_4)]), BOOK, {1})
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
# Estimates, accuracy, privacy report
# ---------------------------------------------------------------------------------------------


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
    fragmented = _recipe(
        "frag", "report_fragmented",
        {"backstop_epsilon": 4.0, "fragment_epsilon": 1.5, "fragments": 3, "domain_size": 16},
        fragmentation={"report": {"tau": 3, "epsilon_backstop": 4.0, "epsilon_fragment": 1.5}},
    )  # fmt: skip
    report = privacy_summary(fragmented, {0: 100_000, 1: 100_000})
    randomizer = fragmented.build_randomizer()
    assert report["epsilon_local_all"] == pytest.approx(randomizer.epsilon_local)
    assert report["epsilon_local_one"] == pytest.approx(randomizer.epsilon_single_fragment)
    assert report["epsilon_local_one"] < report["epsilon_local_all"]

    zero_sum = _recipe(
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
    sketch = _recipe(
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
    commits = {0: [_crowd(T0, "onehot", 101)], 1: [_crowd(T0, "onehot", 99)]}
    honest = [(T0, "onehot", "onehot@1", None, _bucket(b)) for b in range(16)]
    baseline = _n_eff_of([aggregate_batch(_batch(honest), BOOK, {1})], commits)
    assert baseline == pytest.approx(0.5 * 101 + 0.5 * 99)
    # One device floods the release with retired census payloads and data messages.
    flood = honest + [(T0, "onehot", "onehot@1", None, CENSUS_BYTES)] * 10_000
    flood += [(T0, "onehot", "onehot@1", None, _bucket(3))] * 5_000
    flooded = aggregate_batch(_batch(flood), BOOK, {1})
    assert flooded.counts["rejected:census_not_counted"] == 10_000
    assert _n_eff_of([flooded], commits) == baseline


def test_respondent_accumulators_take_released_crowds_of_known_recipes_only():
    crowds = [
        _crowd(T0, "onehot", 300),
        _crowd(T0 + DAY, "onehot", None),  # withheld: no count, no accumulator
        {**_crowd(T0, "onehot", 7), "recipe_id": "nobody@1"},  # unknown recipe: skipped
        _crowd(T0, "tree", 40),
    ]
    out = dict(respondent_accumulators(crowds, 1, BOOK))
    assert out[(HISTOGRAM, T0, T0 + DAY, "onehot", "onehot@1", None)].respondents == {1: 300}
    assert out[(LONGITUDINAL, 0, DAY, "tree", "tree@1", None)].respondents == {(T0, 1): 40}
    assert len(out) == 2
    for bad in (-1, True, 2.5, None):
        crowd = {**_crowd(T0, "onehot", 1), "respondents_released": bad}
        with pytest.raises(ValueError, match="respondents_released"):
            respondent_accumulators([crowd], 0, BOOK)
