"""Pure shuffler functions (transforms/shuffle_core.py), without a pipeline."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from privacy.noise import seeded_random_source
from schemas.avro.reader import read_container_bytes
from tests.transforms import report_factory as rf
from transforms import shuffle_core as core

# Chi-square and rank tests below reject at p < 1e-5: ~1e-5 false failures per check.
P_FAIL = 1e-5


def _batch(records: list[dict]) -> pa.RecordBatch:
    return next(read_container_bytes(rf.report_bytes(records))).columns


def _reasons(records: list[dict], instance: int | None = None) -> list[str]:
    codes = core.validate_reports(_batch(records), rf.rules(instance))
    return [core.REASONS[code] or "valid" for code in codes]


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1d", 86_400_000), ("6h", 21_600_000), ("30m", 1_800_000), ("90s", 90_000), ("500ms", 500)],
)
def test_parse_duration(text: str, expected: int) -> None:
    assert core.parse_duration_ms(text) == expected


@pytest.mark.parametrize("text", ["", "1", "0d", "-1d", "1w", "d1", "1.5h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        core.parse_duration_ms(text)


def test_parameter_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="period_ms"):
        core.WindowSpec(period_ms=0)
    with pytest.raises(ValueError, match="offset_ms"):
        core.WindowSpec(period_ms=10, offset_ms=10)
    with pytest.raises(ValueError, match="shuffler_instances"):
        core.RecipeRoute("c", 0)
    with pytest.raises(ValueError, match="channel"):
        core.RecipeRoute("", 1)
    with pytest.raises(ValueError, match="epsilon"):
        core.DeletionParameters(0.0, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        core.DeletionParameters(1.0, 1.0)
    with pytest.raises(ValueError, match="instance"):
        core.ValidationRules(rf.ROUTES, frozenset({1}), instance=-1)
    with pytest.raises(ValueError, match="routes"):
        core.ValidationRules({}, frozenset({1}))


def test_deletion_parameters_follow_algorithm_3() -> None:
    params = core.DeletionParameters(0.5, 1e-6)
    assert params.scale == 4  # 2 / eps_cr
    assert params.offset == math.ceil(4 * math.log(2 / 1e-6))


def test_crowd_threshold_is_the_largest_demand() -> None:
    assert core.crowd_threshold(100, 0, 20) == 100
    assert core.crowd_threshold(10, 50, 20) == 50
    assert core.crowd_threshold(10, 5, 500) == 500
    assert core.crowd_threshold(0, 0, 0) == 1


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def test_validation_gives_each_bad_record_its_reason() -> None:
    records = [
        rf.report("a"),
        rf.report("a", schema_version=99),
        rf.report("a", recipe_id="unknown@1"),
        rf.report("a", channel=rf.ALT_CHANNEL),  # recipe test@1 belongs to channel "test"
        rf.report("a", instance=2),  # K = 2
        rf.report("a", instance=-1),
        rf.report(""),
        rf.report("a", event_time=-5),
        rf.report("a", min_crowd_size=-1),
        rf.report("a", payload=b""),
        rf.report("a", payload=b"x", crc=12345),
        rf.report("a", payload=b"x", crc=2**40),
        rf.report("b", recipe_id=rf.ALT_RECIPE, channel=rf.ALT_CHANNEL),
    ]
    assert _reasons(records) == [
        "valid",
        "unknown_schema_version",
        "unknown_recipe",
        "recipe_channel_mismatch",
        "instance_out_of_range",
        "instance_out_of_range",
        "empty_origin",
        "event_time_out_of_range",
        "invalid_min_crowd_size",
        "empty_payload",
        "crc_mismatch",
        "crc_mismatch",
        "valid",
    ]


def test_instance_range_is_per_recipe_and_run_instance_is_enforced() -> None:
    records = [
        rf.report("a", instance=1),  # test@1 has K = 2
        rf.report("b", instance=1, recipe_id=rf.ALT_RECIPE, channel=rf.ALT_CHANNEL),  # K = 1
        rf.report("c", instance=0),
    ]
    assert _reasons(records) == ["valid", "instance_out_of_range", "valid"]
    assert _reasons(records, instance=1) == ["valid", "instance_out_of_range", "wrong_instance"]


def test_first_failing_check_wins() -> None:
    # Unknown version and a bad CRC: the version is checked first and is the reason.
    assert _reasons([rf.report("a", schema_version=7, crc=1)]) == ["unknown_schema_version"]


def test_wrong_schema_rejects_the_whole_batch() -> None:
    batch = pa.RecordBatch.from_pydict({"schema_version": [1, 1], "origin": ["a", "b"]})
    assert core.schema_problem(batch.schema) == "field 'shuffler_instance' is missing"
    assert (
        core.validate_reports(batch, rf.rules()).tolist() == [core.REASON_CODE["wrong_schema"]] * 2
    )
    typed = _batch([rf.report("a")]).set_column(1, "shuffler_instance", pa.array(["zero"]))
    assert "shuffler_instance" in core.schema_problem(typed.schema)


def test_extra_fields_are_accepted() -> None:
    batch = _batch([rf.report("a")]).append_column("extra", pa.array([1.5]))
    assert core.validate_reports(batch, rf.rules()).tolist() == [core.VALID]


def test_rejection_detail_explains() -> None:
    record = rf.report("a", crc=1)
    assert "computed" in core.rejection_detail("crc_mismatch", record, rf.rules())
    record = rf.report("a", instance=5)
    assert "[0, 2)" in core.rejection_detail("instance_out_of_range", record, rf.rules())


# ---------------------------------------------------------------------------------------------
# Windows, hashes, grouping
# ---------------------------------------------------------------------------------------------


def test_window_starts() -> None:
    spec = core.WindowSpec(period_ms=1000, offset_ms=100)
    times = np.array([100, 1099, 1100, 99, 0, 5_000_000_123])
    assert core.window_starts(times, spec).tolist() == [100, 100, 1100, -900, -900, 5_000_000_100]


def test_origin_hash_is_keyed_and_deterministic() -> None:
    origins = pa.array([f"device-{i}" for i in range(1000)] + ["device-5", ""])
    key = core.new_origin_hash_key(seeded_random_source(1))
    hashes = core.origin_hashes(origins, key)
    assert hashes.dtype == np.uint64
    assert hashes[5] == hashes[1000]
    assert len(np.unique(hashes[:1000])) == 1000
    # Slices (non-zero Arrow offsets) hash the same values.
    assert np.array_equal(core.origin_hashes(origins.slice(3, 10), key), hashes[3:13])
    other = core.origin_hashes(origins, core.new_origin_hash_key(seeded_random_source(2)))
    assert not np.array_equal(other, hashes)


def test_origin_hash_spreads_shards_uniformly() -> None:
    # Similar origins (a common prefix) must not crowd into a few shards.
    origins = pa.array([f"user-{i:08d}" for i in range(32_000)])
    hashes = core.origin_hashes(origins, core.new_origin_hash_key(seeded_random_source(3)))
    shards = (hashes >> np.uint64(60)).astype(np.int64)
    observed = np.bincount(shards, minlength=16)
    assert stats.chisquare(observed).pvalue > P_FAIL


def test_shard_row_ranges_partition_sorted_rows() -> None:
    hashes = np.sort(
        core.origin_hashes(
            pa.array([str(i) for i in range(500)]),
            core.new_origin_hash_key(seeded_random_source(4)),
        )
    )
    for bits in (0, 1, 3):
        ranges = [core.shard_row_range(hashes, shard, bits) for shard in range(1 << bits)]
        assert ranges[0][0] == 0 and ranges[-1][1] == len(hashes)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        for shard, (begin, end) in enumerate(ranges):
            if bits:
                assert np.all((hashes[begin:end] >> np.uint64(64 - bits)) == shard)


def test_split_bits_follow_crowd_size() -> None:
    assert core.split_bits(0, 100) == 0
    assert core.split_bits(100, 100) == 0
    assert core.split_bits(101, 100) == 1
    assert core.split_bits(1000, 100) == 4
    assert core.split_bits(10**12, 1, max_bits=16) == 16


def test_group_rows_groups_equal_keys() -> None:
    channel = pa.array(["a", "b", "a", "a", "b", "c"])
    crowd = pa.array([None, "x", None, "y", "x", None])
    tiebreak = np.array([5, 4, 3, 2, 1, 0], dtype=np.uint64)
    order, starts = core.group_rows([channel, crowd], tiebreak)
    groups = [order[a:b].tolist() for a, b in itertools.pairwise(starts)]
    assert sorted(sorted(g) for g in groups) == [[0, 2], [1, 4], [3], [5]]
    for group in groups:
        assert tiebreak[group].tolist() == sorted(tiebreak[group].tolist())


def test_group_rows_by_hash_matches_group_rows_with_a_tiebreak() -> None:
    rng = np.random.default_rng(8)
    rows = 5000
    keys = [
        pa.array(rng.choice([rf.T0, rf.T0 + rf.DAY_MS], rows)),
        pa.array(rng.integers(0, 3, rows).astype(np.int32)),
        pa.array(rng.choice(["a", "bb", "ccc"], rows)),
        pa.array(rng.choice(["x", None], rows)),
    ]
    hashes = rng.integers(0, 2**63, rows).astype(np.uint64) << np.uint64(1)
    hashes[:50] = hashes[50:100]  # equal hashes too
    expected_order, expected_starts = core.group_rows(keys, tiebreak=hashes)
    order, starts = core.group_rows_by_hash(keys, hashes)
    assert starts.tolist() == expected_starts.tolist()
    assert hashes[order].tolist() == hashes[expected_order].tolist()
    for begin, end in itertools.pairwise(starts):
        assert sorted(order[begin:end]) == sorted(expected_order[begin:end])


def test_count_distinct() -> None:
    assert core.count_distinct(pa.array(["a", "b", "a", "a", "c"])) == 3


# ---------------------------------------------------------------------------------------------
# Threshold and Algorithm 3
# ---------------------------------------------------------------------------------------------


def test_below_threshold_is_withheld_without_noise() -> None:
    decision = core.decide_crowd(9, 10, core.DeletionParameters(1.0, 1e-6), seeded_random_source(5))
    assert decision.status == core.WITHHELD and decision.withheld_reason == core.BELOW_THRESHOLD
    assert decision.respondents_kept == 0 and decision.respondents_deleted == 0


def test_without_deletion_every_respondent_is_kept() -> None:
    decision = core.decide_crowd(10, 10, None, seeded_random_source(5))
    assert decision.status == core.RELEASED and decision.respondents_kept == 10


@pytest.mark.parametrize(
    ("respondents", "threshold", "epsilon", "delta"),
    [(40, 30, 1.0, 0.5), (200, 10, 0.5, 1e-3)],
)
def test_released_respondents_follow_algorithm_3(
    respondents: int, threshold: int, epsilon: float, delta: float
) -> None:
    """The released count's distribution equals the exact pmf of Algorithm 3 with discrete
    Laplace noise (withheld = aborted or below the threshold after deletion)."""
    params = core.DeletionParameters(epsilon, delta)
    source = seeded_random_source(6)
    draws = 20_000
    kept = np.array(
        [
            (d.respondents_kept if d.status == core.RELEASED else -1)
            for d in (
                core.decide_crowd(respondents, threshold, params, source) for _ in range(draws)
            )
        ]
    )
    pmf, withheld = core.released_respondents_pmf(respondents, threshold, params)
    assert math.isclose(pmf.sum() + withheld, 1.0)
    # Cells: withheld, then released counts, pooled so every expected count is >= 5.
    values = np.arange(respondents + 1)
    expected_cells, observed_cells = [withheld * draws], [np.sum(kept == -1)]
    pending_expected, pending_observed = 0.0, 0
    for value in values:
        pending_expected += pmf[value] * draws
        pending_observed += int(np.sum(kept == value))
        if pending_expected >= 5:
            expected_cells.append(pending_expected)
            observed_cells.append(pending_observed)
            pending_expected, pending_observed = 0.0, 0
    expected_cells[-1] += pending_expected
    observed_cells[-1] += pending_observed
    assert np.sum(kept >= 0) > 0 and set(kept[kept >= 0].tolist()) <= set(
        range(threshold, respondents + 1)
    )
    result = stats.chisquare(observed_cells, expected_cells)
    assert result.pvalue > P_FAIL, (observed_cells, expected_cells)


def test_deletion_aborts_with_probability_below_half_delta() -> None:
    params = core.DeletionParameters(1.0, 0.2)
    pmf, withheld = core.released_respondents_pmf(1000, 1, params)
    assert withheld <= 0.2 / 2  # Theorem V.1: abort probability <= delta_cr / 2


def test_uniform_subset_is_uniform() -> None:
    source = seeded_random_source(7)
    for population, size in ((6, 2), (6, 4)):  # the second draws the complement
        subsets = list(itertools.combinations(range(population), size))
        index = {subset: position for position, subset in enumerate(subsets)}
        counts = np.zeros(len(subsets))
        for _ in range(6000):
            chosen = core.uniform_subset(population, size, source)
            assert len(set(chosen.tolist())) == size and list(chosen) == sorted(chosen)
            counts[index[tuple(chosen.tolist())]] += 1
        assert stats.chisquare(counts).pvalue > P_FAIL
    assert core.uniform_subset(10, 0, source).size == 0
    assert core.uniform_subset(10, 10, source).tolist() == list(range(10))
    with pytest.raises(ValueError):
        core.uniform_subset(3, 4, source)


def test_split_deletions_is_multivariate_hypergeometric() -> None:
    source = seeded_random_source(8)
    shards = np.array([3, 5, 2])
    deleted = 4
    draws = 6000
    outcomes: dict[tuple[int, ...], int] = {}
    for _ in range(draws):
        split = core.split_deletions(shards, deleted, source)
        assert split.sum() == deleted and np.all(split <= shards)
        outcomes[tuple(split.tolist())] = outcomes.get(tuple(split.tolist()), 0) + 1
    total = math.comb(int(shards.sum()), deleted)
    support = [
        split
        for split in itertools.product(*(range(s + 1) for s in shards))
        if sum(split) == deleted
    ]
    expected = [
        draws * math.prod(math.comb(s, k) for s, k in zip(shards, split, strict=True)) / total
        for split in support
    ]
    observed = [outcomes.get(split, 0) for split in support]
    assert sum(observed) == draws
    assert stats.chisquare(observed, expected).pvalue > P_FAIL


def test_kept_rows_remove_whole_respondents() -> None:
    source = seeded_random_source(9)
    codes = np.array([0, 1, 1, 2, 2, 2, 3, 0, 4])
    kept = core.kept_rows(codes, distinct=5, deleted=2, source=source)
    removed = set(codes[~kept].tolist())
    assert len(removed) == 2
    assert not set(codes[kept].tolist()) & removed


def test_merged_buckets_are_uniform_groups() -> None:
    source = seeded_random_source(11)
    buckets = core.assign_groups(40_000, 16, source)
    groups = core.group_of_bucket(buckets, bucket_bits=4, group_bits=2)
    assert set(groups.tolist()) == {0, 1, 2, 3}
    assert np.array_equal(groups, buckets // 4)
    assert stats.chisquare(np.bincount(groups, minlength=4)).pvalue > P_FAIL
    with pytest.raises(ValueError):
        core.group_of_bucket(buckets, bucket_bits=2, group_bits=3)


def test_groups_and_order_are_uniform() -> None:
    source = seeded_random_source(10)
    groups = core.assign_groups(40_000, 8, source)
    assert stats.chisquare(np.bincount(groups, minlength=8)).pvalue > P_FAIL
    # Position of element 0 under the release order is uniform over 10 slots.
    positions = np.array(
        [np.flatnonzero(core.release_order(10, source) == 0)[0] for _ in range(5000)]
    )
    assert stats.chisquare(np.bincount(positions, minlength=10)).pvalue > P_FAIL
    # No rank correlation between arrival order and release order.
    order = core.release_order(5000, source)
    rho = stats.spearmanr(np.arange(5000), order).statistic
    assert abs(rho) < 4.5 / math.sqrt(5000 - 1)  # 4.5 sigma: ~7e-6 per check
