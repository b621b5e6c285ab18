"""The analyzer's combiners called directly (create / add / merge / extract), as Beam's own
combiner tests do: results match a sequential sum and no input or merged accumulator changes."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle

import numpy as np
import pytest

from schemas import parsed_schema
from schemas.release.commit import sha256_of
from transforms.analyzer.aggregate import (
    CombineBucket,
    metrics_summary,
    pinned_crowd_table_group_records,
    pinned_crowd_table_groups,
    pinned_crowd_table_records,
    pinned_crowd_tables,
)
from transforms.analyzer.arithmetic import CrowdAccumulator, CrowdBucket, LongitudinalAccumulator
from transforms.common.avro_io import write_avro
from transforms.common.combiners import SumCounts

KEY = ("histogram", 0, 1000, "grid", "grid@1", None)


class _OneCrowd:
    """CombineBucket seen through buckets of the one crowd KEY (inputs and outputs unwrapped)."""

    def __init__(self, dense_limit=1 << 20):
        self.combiner = CombineBucket(dense_limit)

    def create_accumulator(self):
        return self.combiner.create_accumulator()

    def add_input(self, accumulator, element):
        return self.combiner.add_input(accumulator, CrowdBucket({KEY: element}))

    def merge_accumulators(self, accumulators):
        return self.combiner.merge_accumulators(
            [
                a if isinstance(a, CrowdBucket | None) else CrowdBucket({KEY: a})
                for a in accumulators
            ]
        )

    def compact(self, accumulator):
        return self.combiner.compact(accumulator)

    def extract_output(self, accumulator):
        return self.combiner.extract_output(accumulator)


def _histogram(buckets, respondents=None, dense_limit=1 << 20):
    accumulator = CrowdAccumulator.empty(8, dense_limit)
    accumulator.add_messages(np.asarray(buckets, dtype=np.int64))
    for instance, count in (respondents or {}).items():
        accumulator.set_respondents(instance, count)
    return accumulator


def _state(accumulator):
    """A deep, comparable snapshot of an accumulator's value (of a bucket: of its crowd KEY)."""
    if accumulator is None:
        return None
    if isinstance(accumulator, CrowdBucket):
        return _state(accumulator.crowds[KEY])
    if isinstance(accumulator, CrowdAccumulator):
        return (
            accumulator.counts.dense().tolist(),
            dict(accumulator.respondents),
            accumulator.messages,
            dict(accumulator.rejected or {}),
        )
    return (
        {start: counts.dense().tolist() for start, counts in accumulator.nodes.items()},
        dict(accumulator.respondents),
        accumulator.messages,
    )


@pytest.mark.parametrize("dense_limit", [1 << 20, 0])
def test_combine_bucket_adds_without_touching_its_inputs(dense_limit):
    combiner = _OneCrowd()
    elements = [
        _histogram([1, 2, 2], dense_limit=dense_limit),
        _histogram([], {0: 50}, dense_limit=dense_limit),  # a commit record's count only
        _histogram([7, 7], dense_limit=dense_limit),
        _histogram([], {1: 40}, dense_limit=dense_limit),
    ]
    before = [_state(e) for e in elements]
    left = combiner.create_accumulator()
    for element in elements[:2]:
        left = combiner.add_input(left, element)
    right = combiner.create_accumulator()
    for element in elements[2:]:
        right = combiner.add_input(right, element)
    left_before, right_before = _state(left), _state(right)
    merged = combiner.merge_accumulators([left, right, combiner.create_accumulator()])
    result = combiner.extract_output(combiner.compact(merged))
    assert _state(result) == ([0, 1, 2, 0, 0, 0, 0, 2], {0: 50, 1: 40}, 5, {})
    assert [_state(e) for e in elements] == before  # inputs unchanged
    assert (_state(left), _state(right)) == (left_before, right_before)  # so are accumulators
    # Adding more into the result later does not reach back into any input.
    combiner.add_input(result, _histogram([0]))
    assert [_state(e) for e in elements] == before
    assert _state(pickle.loads(pickle.dumps(result)))[0] == _state(result)[0]


def test_combine_bucket_merges_dense_and_sparse_partials_the_same_in_any_order():
    combiner = _OneCrowd()
    dense, sparse = _histogram([3, 3, 4], {0: 9}), _histogram([4, 5], {1: 2}, dense_limit=0)
    one = combiner.merge_accumulators([dense, sparse]).crowds[KEY]
    other = combiner.merge_accumulators([sparse, dense]).crowds[KEY]
    assert one.counts.is_dense and other.counts.is_dense
    assert _state(one) == _state(other) == ([0, 0, 0, 2, 2, 1, 0, 0], {0: 9, 1: 2}, 5, {})


def test_combine_bucket_never_sums_a_respondent_count_stated_twice():
    combiner = _OneCrowd()
    with pytest.raises(ValueError, match="stated twice"):  # when the added buckets are folded
        combiner.extract_output(
            combiner.merge_accumulators([_histogram([], {0: 50}), _histogram([], {0: 50})])
        )


def test_combine_bucket_handles_longitudinal_rounds_without_touching_inputs():
    combiner = _OneCrowd()
    first = LongitudinalAccumulator(3, 1000)
    first.add_messages(0, np.array([0, 1]), np.array([1, -1]))
    second = LongitudinalAccumulator(3, 1000)
    second.add_messages(0, np.array([2]), np.array([1]))
    second.set_respondents(0, 0, 10)
    before = [_state(first), _state(second)]
    accumulator = combiner.add_input(combiner.create_accumulator(), first)
    accumulator = combiner.add_input(accumulator, second)
    assert _state(accumulator) == ({0: [1, -1, 1]}, {(0, 0): 10}, 3)
    assert [_state(first), _state(second)] == before


def test_sum_counts_adds_counter_dicts_without_touching_inputs():
    combiner = SumCounts()
    parts = [{"read": 3, "messages": 2, "rejected:crc_mismatch": 1}, {"read": 5, "messages": 5}]
    frozen = copy.deepcopy(parts)
    left = combiner.add_input(combiner.create_accumulator(), parts[0])
    right = combiner.add_input(combiner.create_accumulator(), parts[1])
    snapshot = (dict(left), dict(right))
    total = combiner.extract_output(combiner.merge_accumulators([left, right]))
    assert total == {"messages": 7, "read": 8, "rejected:crc_mismatch": 1}
    assert parts == frozen and (left, right) == snapshot
    summary = metrics_summary(total)
    assert summary["adds_up"] and summary["dead_lettered"] == 1
    assert not metrics_summary({"read": 9, "messages": 7})["adds_up"]


@pytest.mark.parametrize("dense_limit", [1 << 20, 0])
def test_accumulators_survive_pickling_as_raw_bytes_and_stay_writable(dense_limit):
    accumulator = _histogram([0, 3, 3, 7], {0: 4}, dense_limit)
    restored = pickle.loads(pickle.dumps(accumulator))
    assert _state(restored) == _state(accumulator)
    restored.add_messages(np.array([3, 5]))  # the restored arrays are writable copies
    assert restored.counts.dense().tolist() == [1, 0, 0, 3, 0, 1, 0, 1]
    assert _state(accumulator)[0] == [1, 0, 0, 2, 0, 0, 0, 1]


def test_crowd_tables_are_read_only_with_their_committed_digests(tmp_path):
    crowd = {"window_start": 0, "window_end": 1000, "instance": 2, "channel": "grid",
             "recipe_id": "grid@1", "crowd_id": "a", "status": "released",
             "respondents_released": 3, "messages_released": 3}  # fmt: skip
    table = tmp_path / "crowds" / "0-u2-b00001.avro"
    table.parent.mkdir()
    write_avro(str(table), parsed_schema("released_crowd"), [crowd])
    record = {"files": [{"path": "messages/0-u2-b00001-g00000.avro", "sha256": "0" * 64},
                        {"path": "crowds/0-u2-b00001.avro", "sha256": sha256_of(str(table))}]}  # fmt: skip
    content = json.dumps(record).encode()
    (tmp_path / "_COMMIT.json").write_bytes(content)
    pinned = (2, str(tmp_path), hashlib.sha256(content).hexdigest())
    [source] = pinned_crowd_tables(pinned)  # crowd tables only, with their committed digest
    assert source == (2, str(table), sha256_of(str(table)))
    [(instance, read)] = pinned_crowd_table_records(source)
    assert instance == 2 and read["window_start_ms"] == 0 and read["respondents_released"] == 3
    write_avro(str(table), parsed_schema("released_crowd"), [{**crowd, "respondents_released": 30}])
    with pytest.raises(
        ValueError, match="SHA-256 differs"
    ):  # a table changed after it was verified
        list(pinned_crowd_table_records(source))
    (tmp_path / "_COMMIT.json").write_text(json.dumps({"files": []}))
    with pytest.raises(ValueError, match="SHA-256 differs"):  # so is a changed commit record
        list(pinned_crowd_tables(pinned))


def test_crowd_tables_in_groups_read_as_one_by_one(tmp_path, monkeypatch):
    """pinned_crowd_table_groups cuts a record's tables into lists of TABLES_PER_ELEMENT; a
    group's tables decoded together give each table's pairs as pinned_crowd_table_records, and a
    table changed after it was verified is refused whichever table of the group it is."""
    from transforms.analyzer import aggregate

    monkeypatch.setattr(aggregate, "TABLES_PER_ELEMENT", 2)
    files = []
    (tmp_path / "crowds").mkdir()
    for bucket in range(5):
        table = tmp_path / "crowds" / f"0-u1-b{bucket:05d}.avro"
        rows = [{"window_start": 0, "window_end": 1000, "instance": 1, "channel": "grid",
                 "recipe_id": "grid@1", "crowd_id": None if i == 0 else f"c{bucket}-{i}",
                 "status": "released" if i % 3 else "withheld",
                 "respondents_released": 3 + i if i % 3 else None,
                 "messages_released": i if i % 3 else 0} for i in range(bucket * 4)]  # fmt: skip
        write_avro(str(table), parsed_schema("released_crowd"), rows)
        files.append({"path": f"crowds/{table.name}", "sha256": sha256_of(str(table))})
    content = json.dumps({"files": files}).encode()
    (tmp_path / "_COMMIT.json").write_bytes(content)
    pinned = (1, str(tmp_path), hashlib.sha256(content).hexdigest())
    groups = list(pinned_crowd_table_groups(pinned))
    assert [len(group) for group in groups] == [2, 2, 1]
    assert [t[:3] for group in groups for t in group] == list(pinned_crowd_tables(pinned))
    for group in groups:
        read = pinned_crowd_table_group_records(group)
        assert [table for table, _ in read] == group
        assert [pairs for _, pairs in read] == [
            list(pinned_crowd_table_records(table[:3])) for table in group
        ]
    second = groups[1][1][1]
    write_avro(second, parsed_schema("released_crowd"), [])
    with pytest.raises(ValueError, match="SHA-256 differs"):
        pinned_crowd_table_group_records(groups[1])


def test_released_sizes_are_the_released_crowds_recipes_and_counts(tmp_path):
    """released_sizes gives each distinct (recipe, respondents released) of the released crowds
    once, the same from a group's columns (TableCrowds) as from its crowds one by one; withheld
    crowds and counts that are missing or below 1 are left out."""
    from transforms.analyzer.aggregate import TableCrowds, released_sizes

    (tmp_path / "crowds").mkdir()
    files, expected = [], set()
    for bucket in range(3):
        table = tmp_path / "crowds" / f"0-u1-b{bucket:05d}.avro"
        rows = []
        for i in range(12):
            released = i % 4 != 0
            count = (3 + i % 5) if released and i != 7 else None
            recipe = "grid@1" if i % 2 else "other@1"
            rows.append({"window_start": 0, "window_end": 1000, "instance": 1, "channel": "grid",
                         "recipe_id": recipe, "crowd_id": f"c{bucket}-{i:02d}",
                         "status": "released" if released else "withheld",
                         "respondents_released": count, "messages_released": i})  # fmt: skip
            if released and count is not None:
                expected.add((recipe, count))
        write_avro(str(table), parsed_schema("released_crowd"), rows)
        files.append({"path": f"crowds/{table.name}", "sha256": sha256_of(str(table))})
    content = json.dumps({"files": files}).encode()
    (tmp_path / "_COMMIT.json").write_bytes(content)
    pinned = (1, str(tmp_path), hashlib.sha256(content).hexdigest())
    group = [table for group in pinned_crowd_table_groups(pinned) for table in group]
    read = pinned_crowd_table_group_records(group)
    assert all(isinstance(pairs, TableCrowds) for _, pairs in read)
    from_columns = set().union(*(released_sizes(pairs) for _, pairs in read))
    one_by_one = set().union(*(released_sizes(list(pairs)) for _, pairs in read))
    assert from_columns == one_by_one == expected
    assert all(type(count) is int for _, count in from_columns)
    assert released_sizes([]) == set()
    assert released_sizes([(0, {"status": "released", "recipe_id": "r", "respondents_released": 0}),
                           (0, {"status": "released", "recipe_id": "r", "respondents_released": True}),
                           (0, {"status": "released", "recipe_id": None, "respondents_released": 4}),
                           (0, {"status": "released", "recipe_id": "r", "respondents_released": 4})]
                          ) == {("r", 4)}  # fmt: skip
