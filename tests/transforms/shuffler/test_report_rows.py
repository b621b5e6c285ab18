"""Pure shuffler row work (transforms/shuffler/report_rows.py, shuffle_params.py), without a pipeline."""

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
from transforms.common import grouping
from transforms.shuffler import report_rows

# Chi-square and rank tests below reject at p < 1e-5: ~1e-5 false failures per check.
P_FAIL = 1e-5


def _batch(records: list[dict]) -> pa.RecordBatch:
    return next(read_container_bytes(rf.report_bytes(records))).columns


def _reasons(records: list[dict], instance: int | None = None) -> list[str]:
    codes = report_rows.validate_reports(_batch(records), rf.rules(instance))
    return [report_rows.REASONS[code] or "valid" for code in codes]


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1d", 86_400_000), ("6h", 21_600_000), ("30m", 1_800_000), ("90s", 90_000), ("500ms", 500)],
)
def test_parse_duration(text: str, expected: int) -> None:
    assert report_rows.parse_duration_ms(text) == expected


@pytest.mark.parametrize("text", ["", "1", "0d", "-1d", "1w", "d1", "1.5h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        report_rows.parse_duration_ms(text)


def test_parameter_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="period_ms"):
        report_rows.WindowSpec(period_ms=0)
    with pytest.raises(ValueError, match="offset_ms"):
        report_rows.WindowSpec(period_ms=10, offset_ms=10)
    with pytest.raises(ValueError, match="shuffler_instances"):
        report_rows.RecipeRoute("c", 0)
    with pytest.raises(ValueError, match="channel"):
        report_rows.RecipeRoute("", 1)
    with pytest.raises(ValueError, match="epsilon"):
        report_rows.DeletionParameters(0.0, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        report_rows.DeletionParameters(1.0, 1.0)
    with pytest.raises(ValueError, match="instance"):
        report_rows.ValidationRules(rf.ROUTES, frozenset({1}), instance=-1)
    with pytest.raises(ValueError, match="routes"):
        report_rows.ValidationRules({}, frozenset({1}))


def test_deletion_parameters_follow_algorithm_3() -> None:
    params = report_rows.DeletionParameters(0.5, 1e-6)
    assert params.scale == 4  # 2 / eps_cr
    assert params.offset == math.ceil(4 * math.log(2 / 1e-6))


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
        "valid",  # an empty payload is a presence message
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
    assert report_rows.schema_problem(batch.schema) == "field 'shuffler_instance' is missing"
    assert (
        report_rows.validate_reports(batch, rf.rules()).tolist()
        == [report_rows.REASON_CODE["wrong_schema"]] * 2
    )
    typed = _batch([rf.report("a")]).set_column(1, "shuffler_instance", pa.array(["zero"]))
    assert "shuffler_instance" in report_rows.schema_problem(typed.schema)


def test_extra_fields_are_accepted() -> None:
    batch = _batch([rf.report("a")]).append_column("extra", pa.array([1.5]))
    assert report_rows.validate_reports(batch, rf.rules()).tolist() == [report_rows.VALID]


def test_rejection_detail_explains() -> None:
    record = rf.report("a", crc=1)
    assert "computed" in report_rows.rejection_detail("crc_mismatch", record, rf.rules())
    record = rf.report("a", instance=5)
    assert "[0, 2)" in report_rows.rejection_detail("instance_out_of_range", record, rf.rules())


# ---------------------------------------------------------------------------------------------
# Windows, hashes, grouping
# ---------------------------------------------------------------------------------------------


def test_window_starts() -> None:
    spec = report_rows.WindowSpec(period_ms=1000, offset_ms=100)
    times = np.array([100, 1099, 1100, 99, 0, 5_000_000_123])
    assert report_rows.window_starts(times, spec).tolist() == [
        100,
        100,
        1100,
        -900,
        -900,
        5_000_000_100,
    ]


def test_origin_hash_is_keyed_and_deterministic() -> None:
    origins = pa.array([f"device-{i}" for i in range(1000)] + ["device-5", ""])
    key = report_rows.new_origin_hash_key(seeded_random_source(1))
    hashes = report_rows.origin_hashes(origins, key)
    assert hashes.dtype == np.uint64
    assert hashes[5] == hashes[1000]
    assert len(np.unique(hashes[:1000])) == 1000
    # Slices (non-zero Arrow offsets) hash the same values.
    assert np.array_equal(report_rows.origin_hashes(origins.slice(3, 10), key), hashes[3:13])
    other = report_rows.origin_hashes(
        origins, report_rows.new_origin_hash_key(seeded_random_source(2))
    )
    assert not np.array_equal(other, hashes)


def test_origin_hash_spreads_shards_uniformly() -> None:
    # Similar origins (a common prefix) must not crowd into a few shards.
    origins = pa.array([f"user-{i:08d}" for i in range(32_000)])
    hashes = report_rows.origin_hashes(
        origins, report_rows.new_origin_hash_key(seeded_random_source(3))
    )
    shards = (hashes >> np.uint64(60)).astype(np.int64)
    observed = np.bincount(shards, minlength=16)
    assert stats.chisquare(observed).pvalue > P_FAIL


def test_shard_row_ranges_partition_sorted_rows() -> None:
    hashes = np.sort(
        report_rows.origin_hashes(
            pa.array([str(i) for i in range(500)]),
            report_rows.new_origin_hash_key(seeded_random_source(4)),
        )
    )
    for bits in (0, 1, 3):
        ranges = [report_rows.shard_row_range(hashes, shard, bits) for shard in range(1 << bits)]
        assert ranges[0][0] == 0 and ranges[-1][1] == len(hashes)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        for shard, (begin, end) in enumerate(ranges):
            if bits:
                assert np.all((hashes[begin:end] >> np.uint64(64 - bits)) == shard)


def test_group_rows_groups_equal_keys() -> None:
    channel = pa.array(["a", "b", "a", "a", "b", "c"])
    crowd = pa.array([None, "x", None, "y", "x", None])
    tiebreak = np.array([5, 4, 3, 2, 1, 0], dtype=np.uint64)
    order, starts = grouping.group_rows([channel, crowd], tiebreak)
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
    expected_order, expected_starts = grouping.group_rows(keys, tiebreak=hashes)
    order, starts = grouping.group_rows_by_hash(keys, hashes)
    assert starts.tolist() == expected_starts.tolist()
    assert hashes[order].tolist() == hashes[expected_order].tolist()
    for begin, end in itertools.pairwise(starts):
        assert sorted(order[begin:end]) == sorted(expected_order[begin:end])


def test_count_distinct() -> None:
    assert grouping.count_distinct(pa.array(["a", "b", "a", "a", "c"])) == 3
