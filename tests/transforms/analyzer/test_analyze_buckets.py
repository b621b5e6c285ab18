"""Crowd buckets of the analyzer: bucket keys, partial buckets from batches and commit records,
their combiner, and a message file holding many crowds read through the decoder."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from privacy.rng import seeded_generator
from schemas import schema_json
from schemas.avro.container import encode_container
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import encode_payloads
from schemas.release.crowd_buckets import crowd_bucket
from tests.transforms.analyzer.analyzer_messages import (
    BOOK,
    DAY,
    ONE_HOT,
    T0,
    TREE,
    bucket_payload,
    commit_crowd,
    message_batch,
    recipe_of,
)
from transforms.analyzer import arithmetic
from transforms.analyzer.aggregate import CombineBucket, DecodeReleaseFile


def _key(day: int, crowd_id: str | None, recipe=ONE_HOT) -> arithmetic.CrowdKey:
    return (arithmetic.HISTOGRAM, T0 + day * DAY, T0 + (day + 1) * DAY, recipe.channel, recipe.id,
            crowd_id)  # fmt: skip


def test_bucket_key_is_the_crowd_bucket_of_its_crowd_in_every_window():
    first, later = _key(0, "a"), _key(5, "a")
    bucket = crowd_bucket(ONE_HOT.channel, ONE_HOT.id, "a", 16)
    assert arithmetic.bucket_key(first, 16) == (arithmetic.HISTOGRAM, T0, T0 + DAY, bucket)
    assert arithmetic.bucket_key(later, 16)[3] == bucket  # window is in the key, not in the hash
    buckets = {arithmetic.bucket_key(_key(0, f"c{i}"), 16)[3] for i in range(200)}
    assert buckets == set(range(16))  # 200 crowds reach every bucket (P(miss) < 16 (15/16)^200)


def test_the_analyzer_has_more_buckets_with_more_crowds_so_none_grows():
    assert (
        arithmetic.analyzer_buckets(0)
        == arithmetic.analyzer_buckets(16_000)
        == arithmetic.ANALYZER_BUCKETS
    )
    assert arithmetic.analyzer_buckets(16_001) == 17  # at most CROWDS_PER_BUCKET crowds each
    assert (
        arithmetic.analyzer_buckets(100_000) == 100 and arithmetic.analyzer_buckets(10**9) == 65536
    )
    assert arithmetic.analyzer_buckets(2_500, crowds_per_bucket=100) == 25
    # A bucket of one window holds about crowds / buckets crowds: 100 buckets of 100,000 crowds
    # in one window, none with more than a few standard deviations above 1,000.
    keys = [(arithmetic.HISTOGRAM, 0, DAY, "c", "r@1", f"k{i}") for i in range(100_000)]
    sizes = np.bincount([arithmetic.bucket_key(key, 100)[3] for key in keys], minlength=100)
    assert sizes.max() < 1_000 + 5 * np.sqrt(1_000)  # ~3e-7 per bucket under the SHA-256 hash


def test_a_bucket_pickles_as_one_blob_and_merges_without_touching_its_inputs():
    first = arithmetic.CrowdAccumulator.empty(16)
    first.add_messages(np.array([1, 1, 3]))
    second = arithmetic.CrowdAccumulator.empty(16)
    second.set_respondents(0, 9)
    withheld = (T0, T0 + DAY, "onehot", "onehot@1", "b", 1)
    left = arithmetic.CrowdBucket({_key(0, "a"): first})
    right = arithmetic.CrowdBucket({_key(0, "a"): second, _key(0, None): second}, [withheld])
    state = left.__getstate__()
    assert isinstance(state, bytes)  # one compressed blob, not objects per crowd
    restored = pickle.loads(pickle.dumps(left))
    restored.merge(right)
    assert restored.crowds[_key(0, "a")].counts.dense()[[1, 3]].tolist() == [2, 1]
    assert restored.crowds[_key(0, "a")].respondents == {0: 9}
    assert restored.withheld == [withheld] and len(restored) == 2
    assert [key for key, _ in restored.items()] == [_key(0, None), _key(0, "a")]  # null first
    assert first.respondents == {} and second.messages == 0  # inputs unchanged
    restored.crowds[_key(0, None)].set_respondents(1, 4)
    assert second.respondents == {0: 9}  # a crowd only the other held was copied


def test_commit_buckets_hold_released_counts_and_withheld_records_in_their_buckets():
    crowds = [
        (0, commit_crowd(T0, "onehot", 40, "a")),
        (1, commit_crowd(T0, "onehot", 30, "a")),
        (1, commit_crowd(T0 + DAY, "onehot", None, "a")),  # withheld: a record, no accumulator
        (0, commit_crowd(T0, "tree", 25)),
        (0, commit_crowd(T0, "tree", None, "z")),  # withheld longitudinal: the round's bucket
        (0, {**commit_crowd(T0, "unknown", None), "recipe_id": "nope@1"}),
        (0, {**commit_crowd(T0, "unknown", 5), "recipe_id": "nope@1"}),  # released, unknown
    ]
    buckets = arithmetic.commit_buckets(crowds, BOOK, 4)
    crowd_a = _key(0, "a")
    released = buckets[arithmetic.bucket_key(crowd_a, 4)].crowds[crowd_a]
    assert released.respondents == {0: 40, 1: 30} and released.messages == 0
    assert not released.counts.is_dense  # travels empty; densified when extracted
    tree_key = (arithmetic.LONGITUDINAL, 0, DAY, "tree", TREE.id, None)
    assert buckets[arithmetic.bucket_key(tree_key, 4)].crowds[tree_key].respondents == {(T0, 0): 25}
    withheld = sorted(r for b in buckets.values() for r in b.withheld)
    assert withheld == sorted([
        (T0 + DAY, T0 + 2 * DAY, "onehot", "onehot@1", "a", 1),
        (T0, T0 + DAY, "tree", "tree@1", "z", 0),
        (T0, T0 + DAY, "unknown", "nope@1", None, 0),
    ])  # fmt: skip
    tree_unit = arithmetic.bucket_key((arithmetic.LONGITUDINAL, 0, DAY, "tree", TREE.id, "z"), 4)
    assert buckets[tree_unit].withheld == [(T0, T0 + DAY, "tree", "tree@1", "z", 0)]
    assert sum(len(b) for b in buckets.values()) == 2  # unknown recipes add no accumulator
    combine = CombineBucket()
    extracted = combine.extract_output(
        combine.add_input(None, buckets[arithmetic.bucket_key(crowd_a, 4)])
    )
    assert extracted.crowds[crowd_a].counts.is_dense  # a small domain, counted densely
    with pytest.raises(ValueError, match="respondents_released"):
        arithmetic.commit_buckets([(0, commit_crowd(T0, "onehot", -1))], BOOK, 4)


def _write_message_file(
    path, starts: np.ndarray, crowd_ids: list, values: np.ndarray, codec="null"
):
    """A shuffled-message file of ONE_HOT rows: each row's window start, crowd ID and bucket."""
    payloads = encode_payloads("bucket", {"bucket": values}).to_arrow()
    columns = {
        "schema_version": 1,
        "window_start": starts,
        "window_end": starts + DAY,
        "channel": ONE_HOT.channel,
        "recipe_id": ONE_HOT.id,
        "crowd_id": pa.array(crowd_ids, pa.string()),
        "payload": payloads,
        "payload_crc32c": crc32c_many(payloads).astype(np.int64),
    }
    path.write_bytes(
        encode_container(schema_json("shuffled_message"), columns, len(crowd_ids), codec)
    )


def test_a_message_file_of_many_crowds_adds_up_per_crowd_in_bucket_elements(tmp_path):
    """Rows of 60 crowds over two windows in one file (grouped by crowd, as a bucket's message
    file is): every crowd's bucket sums equal its rows', one element per batch and bucket."""
    rng = seeded_generator(3)
    crowds = [(day, f"c{i:02d}") for day in (0, 1) for i in range(30)]
    sizes = rng.integers(1, 40, size=len(crowds))
    row_crowd = np.repeat(np.arange(len(crowds)), sizes)
    values = rng.integers(0, 16, size=row_crowd.size)
    starts = np.array([T0 + crowds[c][0] * DAY for c in row_crowd], dtype=np.int64)
    path = tmp_path / "messages.avro"
    _write_message_file(path, starts, [crowds[c][1] for c in row_crowd], values, "deflate")
    decode = DecodeReleaseFile(BOOK, {1}, batch_records=256, buckets=4)
    decode.setup()
    outputs = [out for out in decode.process(str(path)) if isinstance(out, tuple)]
    batches = -(-row_crowd.size // 256)
    assert len(outputs) <= batches * 2 * 4 < len(crowds) * batches  # per batch and bucket
    combine = CombineBucket()
    merged: dict = {}
    for unit, bucket in outputs:
        merged[unit] = combine.add_input(merged.get(unit), bucket)
    seen = {}
    for unit, bucket in merged.items():
        for key, accumulator in combine.extract_output(bucket).items():
            assert arithmetic.bucket_key(key, 4) == unit
            seen[key] = accumulator.counts.dense()
    assert len(seen) == len(crowds)
    for index, (day, crowd_id) in enumerate(crowds):
        expected = np.bincount(values[row_crowd == index], minlength=16)
        np.testing.assert_array_equal(seen[_key(day, crowd_id)], expected)


def test_buckets_added_lazily_stay_packed_and_equal_eager_merges():
    """CombineBucket's adds keep the accumulator a compressed blob between folds; the folded
    result equals merging the same buckets one by one."""
    rng = seeded_generator(4)
    parts = []
    for index in range(60):
        accumulator = arithmetic.CrowdAccumulator.empty(16)
        accumulator.add_messages(rng.integers(0, 16, size=5))
        parts.append(arithmetic.CrowdBucket({_key(index % 3, f"c{index % 25}"): accumulator}))
    lazy, eager = arithmetic.CrowdBucket(), arithmetic.CrowdBucket()
    for part in parts:
        lazy.add(part)
        eager.merge(part)
    assert not lazy._crowds and lazy._pending  # blobs: no Python objects per crowd while adding
    assert len(lazy) == len(eager) == 60
    for (key, mine), (other_key, other) in zip(lazy.items(), eager.items(), strict=True):
        assert key == other_key and mine.messages == other.messages
        np.testing.assert_array_equal(mine.counts.dense(), other.counts.dense())


def _snapshot(bucket: arithmetic.CrowdBucket) -> list:
    """Every crowd of a bucket as plain values (sums, density, respondents in their order)."""
    out = []
    for key, accumulator in bucket.items():
        if isinstance(accumulator, arithmetic.LongitudinalAccumulator):
            nodes = {start: c.dense().tolist() for start, c in accumulator.nodes.items()}
            out.append((key, nodes, accumulator.respondents, accumulator.messages))
            continue
        counts = accumulator.counts
        out.append((key, counts.is_dense, counts.sparse()[0].tolist(), counts.sparse()[1].tolist(),
                    list(accumulator.respondents.items()), accumulator.messages,
                    accumulator.rejected))  # fmt: skip
    return out


@pytest.mark.parametrize("sparse_buckets", [False, True])
def test_buckets_added_as_rows_equal_accumulators_merged_one_by_one(sparse_buckets):
    """Packed buckets keep small-domain histogram crowds as rows of a matrix and add them with
    numpy; whatever mix of dense sums, sparse ones (empty: a commit record's n_u; or holding
    buckets: a small dense limit), longitudinal crowds, rejections and withheld records the parts
    hold, the folded bucket equals merging the accumulators one by one, and no part changes.
    (A crowd that is rows in one part and sparse sums with buckets in another is merged as
    accumulators: ``sparse_buckets``.)"""
    rng = seeded_generator(7)
    parts = []
    for index in range(90):
        key = _key(index % 2, f"c{index % 13}")
        choice = index % 6
        if choice == 0:  # a commit record's respondents: empty sparse sums
            accumulator = arithmetic.CrowdAccumulator.empty(16, 0)
            accumulator.set_respondents(index // 6, int(rng.integers(1, 50)))
        elif choice == 1 and sparse_buckets:  # sparse sums with buckets (a small dense limit)
            accumulator = arithmetic.CrowdAccumulator.empty(16, 0)
            accumulator.add_messages(rng.integers(0, 16, size=3))
        elif choice == 2:
            accumulator = arithmetic.LongitudinalAccumulator(7, DAY)
            accumulator.add_messages(T0, rng.integers(0, 7, size=4), np.ones(4, dtype=np.int64))
            key = (arithmetic.LONGITUDINAL, 0, DAY, TREE.channel, TREE.id, f"t{index % 5}")
        else:
            accumulator = arithmetic.CrowdAccumulator.empty(16)
            accumulator.add_messages(rng.integers(0, 16, size=4))
            if choice == 4:
                accumulator.add_rejected("crc_mismatch", 2)
        withheld = [(T0, T0 + DAY, "onehot", "onehot@1", f"w{index}", 0)] if choice == 5 else []
        parts.append(arithmetic.CrowdBucket({key: accumulator}, withheld))
    before = [_snapshot(part) for part in parts]
    for dense_limit in (1 << 20, 0):
        lazy, eager = arithmetic.CrowdBucket(), arithmetic.CrowdBucket()
        for part in parts:
            lazy.add(pickle.loads(pickle.dumps(part)))
            eager.merge(part)
        lazy = pickle.loads(pickle.dumps(lazy))
        lazy.densify(dense_limit)
        eager.densify(dense_limit)
        assert _snapshot(lazy) == _snapshot(eager)
        assert sorted(lazy.withheld) == sorted(eager.withheld) and len(lazy.withheld) == 15
    assert [_snapshot(part) for part in parts] == before
    twice = arithmetic.CrowdAccumulator.empty(16, 0)
    twice.set_respondents(0, 5)
    doubled = arithmetic.CrowdBucket()
    for _ in range(2):
        doubled.add(arithmetic.CrowdBucket({_key(0, "a"): twice}))
    with pytest.raises(ValueError, match="stated twice"):
        doubled.densify(1 << 20)


@pytest.mark.parametrize(("shuffler", "analyzer"), [(16, 16), (16, 4), (32, 16), (16, 5), (7, 7)])
def test_a_tables_crowds_are_in_the_analyzer_bucket_its_stem_gives(shuffler, analyzer):
    """table_analyzer_bucket: when the analyzer's bucket count divides the release's, every
    crowd of a crowd table (each hashing to its stem's bucket, as verify_release checks) is in
    the analyzer bucket its stem gives, so commit_buckets given those buckets makes exactly the
    buckets it makes hashing each crowd; otherwise it gives None (each crowd is hashed)."""
    from transforms.analyzer.aggregate import table_analyzer_bucket

    recipes = ["onehot", "tree", "unknown"]
    crowds = []
    for index in range(300):
        recipe = recipes[index % 3]
        crowd = commit_crowd(T0 + (index % 2) * DAY, recipe, None if index % 7 == 0 else 5,
                             None if index < 3 else f"k{index}")  # fmt: skip
        if recipe == "unknown":
            crowd["recipe_id"] = "nope@1"
        crowds.append((index % 2, crowd))
    hashed = arithmetic.commit_buckets(crowds, BOOK, analyzer)
    known = []
    for instance, crowd in crowds:
        stem = crowd_bucket(crowd["channel"], crowd["recipe_id"], crowd["crowd_id"], shuffler)
        path = f"/release/crowds/{crowd['window_start_ms']}-u{instance}-b{stem:05d}.avro"
        known.append(table_analyzer_bucket((instance, path, "0" * 64, shuffler), analyzer))
    if shuffler % analyzer:
        assert known == [None] * len(crowds)
        return
    given = arithmetic.commit_buckets(crowds, BOOK, analyzer, known)
    assert sorted(given) == sorted(hashed) and len(given) > 1
    for unit, bucket in hashed.items():
        assert sorted(given[unit].withheld, key=str) == sorted(bucket.withheld, key=str)
        assert {k: (a.respondents, a.messages) for k, a in given[unit].crowds.items()} == {
            k: (a.respondents, a.messages) for k, a in bucket.crowds.items()
        }
    assert table_analyzer_bucket((0, "/release/crowds/x.avro", "0" * 64, shuffler), 4) is None
    assert table_analyzer_bucket((0, path, "0" * 64, True), 1) is None  # bool is no count


@pytest.mark.parametrize(("shuffler", "analyzer"), [(16, 16), (16, 4), (32, 16), (16, 5)])
def test_a_message_files_crowds_are_in_the_analyzer_bucket_its_stem_gives(
    tmp_path, shuffler, analyzer
):
    """release_file_analyzer_bucket: a release's message files (each crowd in the file of the
    stem bucket it hashes to, as the crowd-count check makes sure) give the same buckets read
    with the release's crowd_buckets as hashing each crowd; None unless the counts divide."""
    from transforms.analyzer.aggregate import release_bucket, release_file_analyzer_bucket

    rng = seeded_generator(5)
    release = tmp_path / "release"
    (release / "messages").mkdir(parents=True)
    crowds = [(day, f"c{i:03d}") for day in (0, 1) for i in range(120)]
    stems: dict[tuple[int, int], list[int]] = {}
    for index, (day, crowd_id) in enumerate(crowds):
        stem = crowd_bucket(ONE_HOT.channel, ONE_HOT.id, crowd_id, shuffler)
        stems.setdefault((day, stem), []).append(index)
    paths = []
    for (day, stem), members in sorted(stems.items()):
        sizes = rng.integers(1, 6, size=len(members))
        row_crowd = np.repeat(members, sizes)
        start = T0 + day * DAY
        path = release / "messages" / f"{start}-u0-b{stem:05d}-g00000.avro"
        _write_message_file(
            path,
            np.full(row_crowd.size, start, dtype=np.int64),
            [crowds[c][1] for c in row_crowd],
            rng.integers(0, 16, row_crowd.size),
        )
        paths.append(str(path))

    def buckets(release_buckets):
        decode = DecodeReleaseFile(BOOK, {1}, buckets=analyzer, release_buckets=release_buckets)
        decode.setup()
        combine, merged = CombineBucket(), {}
        for path in paths:
            for unit, bucket in (o for o in decode.process(path) if isinstance(o, tuple)):
                merged[unit] = combine.add_input(merged.get(unit), bucket)
        return {unit: _snapshot(combine.extract_output(b)) for unit, b in merged.items()}

    given = {str(release): shuffler}
    known = [release_file_analyzer_bucket(release_bucket(p), analyzer, given) for p in paths]
    if shuffler % analyzer:
        assert known == [None] * len(paths)
    else:
        assert None not in known
    assert buckets(given) == buckets(None) and len(buckets(None)) > 2
    found = release_bucket(paths[0])
    assert release_file_analyzer_bucket(found, analyzer, {}) is None  # an unknown release
    assert release_file_analyzer_bucket(found, 1, {str(release): True}) is None  # no count
    assert release_file_analyzer_bucket(None, 1, given) is None  # not a release file's name


def test_a_combined_bucket_is_densified_as_rows_like_its_accumulators():
    """CombineBucket.extract_output densifies a bucket whose added parts still wait packed as
    rows (no accumulator per crowd), with the counts densify gives the same crowds as
    accumulators (sparse respondent-only crowds of small domains made dense)."""
    small, large = arithmetic.CrowdAccumulator.empty(16), arithmetic.CrowdAccumulator.empty(1 << 13)
    small.add_messages(np.array([1, 1, 3]))
    large.add_messages(np.array([7]))
    only_n = arithmetic.CrowdAccumulator.empty(16)
    only_n.set_respondents(1, 5)
    parts = [
        arithmetic.CrowdBucket({_key(0, "a"): small, _key(0, "big"): large}),
        arithmetic.CrowdBucket({_key(0, "a"): only_n, _key(0, "n"): only_n.copy()}),
    ]
    combine = CombineBucket(dense_limit=1 << 12)
    accumulator = None
    for part in parts:
        accumulator = combine.add_input(accumulator, pickle.loads(pickle.dumps(part)))
    extracted = combine.extract_output(accumulator)
    reference = arithmetic.CrowdBucket()
    for part in parts:
        reference.merge(part)
    reference.densify(1 << 12)
    assert sorted(extracted.crowds) == sorted(reference.crowds)
    for key, mine in extracted.crowds.items():
        theirs = reference.crowds[key]
        assert mine.counts.is_dense == theirs.counts.is_dense
        assert mine.counts.dense().tolist() == theirs.counts.dense().tolist()
        assert (mine.respondents, mine.messages) == (theirs.respondents, theirs.messages)
    assert extracted.crowds[_key(0, "n")].counts.is_dense


def _state(bucket: arithmetic.CrowdBucket) -> dict:
    """A bucket's crowds as comparable values: key -> (sums, messages, respondents, rejected)."""
    return {
        key: (
            accumulator.counts.dense().tolist(),
            accumulator.messages,
            accumulator.respondents,
            accumulator.rejected,
        )
        for key, accumulator in bucket.items()
    }


def test_a_batch_as_rows_is_bucketed_as_its_accumulators_are():
    """``aggregate_batch(as_rows=True)`` + ``bucket_accumulators(..., rows)``: the same units
    and crowds as the accumulators one by one, where a unit holds only rows (a small dense
    domain) and where it also holds a crowd counted one by one (a domain over the dense limit,
    here 8), and through a ``known`` map of crowd buckets, filled and then reused."""
    small = recipe_of("small", "one_hot_rappor", {"domain_size": 4, "epsilon": 2.0})
    book = arithmetic.RecipeBook([small, ONE_HOT, TREE])
    rng = seeded_generator(5)
    rows = [
        (T0 + day * DAY, recipe.channel, recipe.id, f"c{crowd}", bucket_payload(int(value)))
        for day in (0, 1)
        for recipe, domain in ((small, 4), (ONE_HOT, 16))
        for crowd in range(40)
        for value in rng.integers(0, domain, size=int(rng.integers(1, 5)))
    ]
    batch = message_batch(rows)
    each = arithmetic.aggregate_batch(batch, book, {1}, dense_limit=8)
    as_rows = arithmetic.aggregate_batch(batch, book, {1}, dense_limit=8, as_rows=True)
    assert [part.domain for part in as_rows.rows] == [4] and len(as_rows.rows[0].keys) == 80
    assert {key: _state(arithmetic.CrowdBucket({key: value}))[key]
            for key, value in as_rows.all_accumulators().items()} == {
        key: _state(arithmetic.CrowdBucket({key: value}))[key]
        for key, value in each.accumulators.items()
    }  # fmt: skip
    expected = arithmetic.bucket_accumulators(each.accumulators, 2)
    known: dict = {}
    for _ in range(2):
        found = arithmetic.bucket_accumulators(as_rows.accumulators, 2, as_rows.rows, known)
        assert found.keys() == expected.keys()
        assert {unit: _state(b) for unit, b in found.items()} == {
            unit: _state(b) for unit, b in expected.items()
        }
        assert len(known) == 80  # (channel, recipe, crowd): each window's crowds share it
    mixed = [
        unit for unit, b in found.items() if {k[4] for k in b.crowds} == {small.id, ONE_HOT.id}
    ]
    assert mixed  # a unit with both (P(none) = 2^-79: 40 crowds of each recipe, 2 buckets)


def test_a_known_map_of_crowd_buckets_stays_within_its_limit():
    crowds = [("ch", "r@1", f"c{i}") for i in range(50)]
    known: dict = {}
    for start in range(0, 50, 7):
        part = crowds[start : start + 9]
        got = arithmetic.crowd_buckets_known(part, 16, known, limit=20)
        assert got == [crowd_bucket(*crowd, 16) for crowd in part] and len(known) <= 20
    assert arithmetic.crowd_buckets_known(crowds, 16, known, limit=20) == [
        crowd_bucket(*crowd, 16) for crowd in crowds
    ]
    assert len(known) <= 20


def test_a_file_with_rejected_messages_buckets_every_crowd_as_accumulators(tmp_path):
    """A batch with a rejection (a bad CRC) adds it to its crowd's accumulator: the batch's
    row crowds become accumulators first, so the crowd is in its bucket once, with its sums
    and its rejection, as are the batch's other crowds."""
    rows = [
        (T0, ONE_HOT.channel, ONE_HOT.id, f"c{crowd}", bucket_payload(value))
        for crowd in range(20)
        for value in (crowd % 16, 3)
    ]
    rows[4] = (*rows[4], 12345)  # crowd c2's first message: a CRC that is not its payload's
    batch = message_batch(rows)
    path = tmp_path / "messages.avro"
    columns = {name: batch.column(name) for name in batch.schema.names}
    path.write_bytes(encode_container(schema_json("shuffled_message"), columns, len(rows), "null"))
    decode = DecodeReleaseFile(BOOK, {1}, buckets=2)
    decode.setup()
    outputs = [out for out in decode.process(str(path)) if isinstance(out, tuple)]
    seen = {}
    for unit, bucket in outputs:
        for key, accumulator in bucket.items():
            assert arithmetic.bucket_key(key, 2) == unit and key not in seen
            seen[key] = accumulator
    assert len(seen) == 20
    for crowd in range(20):
        accumulator = seen[_key(0, f"c{crowd}")]
        expected = np.bincount([3] if crowd == 2 else [crowd % 16, 3], minlength=16)
        np.testing.assert_array_equal(accumulator.counts.dense(), expected)
        assert accumulator.rejected == ({"crc_mismatch": 1} if crowd == 2 else {})


def _columns(rows: list[dict]):
    """Crowd dicts as the CrowdColumns the verifying pass decodes (its column types)."""
    from schemas.release.crowd_tables import CROWD_FIELDS, CrowdColumns

    types = [pa.int64(), pa.int64(), pa.int32(), pa.string(), pa.string(), pa.string(),
             pa.string(), pa.int64(), pa.int64()]  # fmt: skip
    schema = pa.schema(list(zip(CROWD_FIELDS, types, strict=True)))
    return CrowdColumns(pa.RecordBatch.from_pylist(rows, schema=schema))


def _random_tables(rng, instance: int) -> list[tuple[int, object, int | None]]:
    """Tables of one instance as a verified release has them (each crowd key in one table):
    crowds of small and longitudinal domains, of a recipe not in the book, withheld ones."""
    tables = []
    for table in range(rng.integers(1, 6)):
        start = T0 + int(rng.integers(0, 3)) * DAY
        rows = []
        for index in range(rng.integers(0, 30)):
            recipe = ["onehot", "tree", "small", "unknown"][rng.integers(0, 4)]
            released = rng.random() < 0.8
            crowd = commit_crowd(start, recipe, int(rng.integers(0, 50)) if released else None,
                                 None if index == 0 and table == 0 else f"t{table}-{index}")  # fmt: skip
            crowd["window_end_ms"] = start + DAY * int(rng.integers(1, 3))
            crowd["messages_released"] = int(rng.integers(0, 9)) if released else 0
            rows.append({**crowd, "instance": instance, "recipe_id": f"{recipe}@1"})
        known = None if rng.random() < 0.5 else int(rng.integers(0, 4))
        tables.append((instance, _columns(rows), known))
    return tables


def _plain(value):
    """A bucket's state as lists, dicts and numbers (accumulators by their fields)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "__dict__") or hasattr(value, "__slots__"):
        fields = getattr(value, "__dict__", None) or {
            name: getattr(value, name) for name in value.__slots__ if hasattr(value, name)
        }
        return (type(value).__name__, _plain(fields))
    return value


def _states(buckets: dict) -> list:
    """Each unit and its packed content, in order."""
    from transforms.analyzer.arithmetic.buckets import _decompressed

    return [(unit, _plain(_decompressed(bucket.__getstate__())))
            for unit, bucket in buckets.items()]  # fmt: skip


def test_buckets_from_a_tables_columns_are_those_of_its_crowds_one_by_one():
    """commit_table_buckets (crowd tables' columns, row crowds grouped by numpy) makes exactly
    the buckets, in the same order with the same content, that commit_buckets makes of the same
    crowds one by one, for known and hashed buckets, and the count check's stated records of a
    table's columns are those of its rows; crowds commit_buckets refuses, or tables of several
    instances, are left to commit_buckets (the same error)."""
    from tests.transforms.analyzer.analyzer_messages import recipe_of
    from transforms.analyzer.aggregate import (
        crowd_records_table,
        stated_record_table,
        stated_records,
    )

    small = recipe_of("small", "one_hot_rappor", {"domain_size": 4, "epsilon": 1.0})
    book = arithmetic.RecipeBook([ONE_HOT, TREE, small])
    rng = seeded_generator(5)
    for _ in range(40):
        tables = _random_tables(rng, int(rng.integers(0, 3)))
        if rng.random() < 0.2:  # another instance's table among them
            tables += _random_tables(rng, 7)[:1]
        pairs = [(instance, crowd) for instance, crowds, _ in tables for crowd in crowds]
        known = [bucket for _, crowds, bucket in tables for _ in range(len(crowds))]
        expected = arithmetic.commit_buckets(pairs, book, 4, known)
        assert _states(arithmetic.commit_table_buckets(tables, book, 4)) == _states(expected)
        for _, crowds, _ in tables:
            assert stated_record_table(crowds).to_pylist() == (
                crowd_records_table(stated_records(crowds.rows())).to_pylist()
            )
    onehot = {**commit_crowd(T0, "onehot", 3, "a"), "instance": 0}
    for wrong, words in [
        ({"respondents_released": None}, "respondents_released"),
        ({"window_end_ms": T0}, "start < end"),
    ]:
        with pytest.raises(ValueError, match=words):
            arithmetic.commit_table_buckets([(0, _columns([onehot, {**onehot, **wrong}]), 1)],
                                            book, 4)  # fmt: skip
    with pytest.raises(ValueError, match="respondents need instance >= 0"):
        arithmetic.commit_table_buckets([(-1, _columns([onehot]), 1)], book, 4)


def test_a_bucket_combined_from_one_input_crosses_as_that_inputs_blob():
    """An empty bucket takes the first bucket added as its blob, and densify of a packed bucket
    waits with the blob (pickled too) until the content is read: the same crowds as densified
    at once, and a later add applies it before adding."""
    only_n = arithmetic.CrowdAccumulator.empty(16, 0)  # sparse: a respondent count only
    only_n.set_respondents(1, 5)
    counted = arithmetic.CrowdAccumulator.empty(16)
    counted.add_messages(np.array([2, 2]))
    part = arithmetic.CrowdBucket({_key(0, "n"): only_n, _key(0, "c"): counted})
    blob = part.__getstate__()
    combine = CombineBucket(dense_limit=1 << 12)
    combined = combine.compact(combine.add_input(None, pickle.loads(pickle.dumps(part))))
    assert combined.__getstate__() == blob  # taken whole: not unpacked and packed again
    extracted = combine.extract_output(combined)
    assert extracted.__getstate__() == (blob, 1 << 12)
    restored = pickle.loads(pickle.dumps(extracted))
    reference = arithmetic.CrowdBucket()
    reference.merge(part)
    reference.densify(1 << 12)
    assert _snapshot(restored) == _snapshot(reference)
    assert restored.crowds[_key(0, "n")].counts.is_dense
    assert not part.crowds[_key(0, "n")].counts.is_dense  # the input unchanged

    # densified, then added to: the densify holds for what was there before the add only
    later = arithmetic.CrowdAccumulator.empty(16, 0)
    later.set_respondents(2, 3)
    extracted.add(arithmetic.CrowdBucket({_key(0, "later"): later}))
    reference.merge(arithmetic.CrowdBucket({_key(0, "later"): later}))
    assert _snapshot(extracted) == _snapshot(reference)
    assert not extracted.crowds[_key(0, "later")].counts.is_dense


def test_a_bucket_combined_from_several_blobs_crosses_as_them_unopened(monkeypatch):
    """A combiner's bucket made of blobs only (its first input's and those added after it)
    is not folded by compact: it crosses the grouping as those blobs, and where it is read
    (merged, extracted) holds what adding the inputs at once holds, densified; a second
    combine of such buckets takes all of their blobs."""
    rng = seeded_generator(6)
    inputs = []
    for part in range(4):  # counts in the even parts, respondents of the same crowds in the odd
        crowds = {}
        for index in range(30):
            if part % 2:
                accumulator = arithmetic.CrowdAccumulator.empty(16, 0)
                accumulator.set_respondents(part, 3)
            else:
                accumulator = arithmetic.CrowdAccumulator.empty(16)
                accumulator.add_messages(rng.integers(0, 16, size=4))
            crowds[_key(part // 2, f"c{index}")] = accumulator
        inputs.append(arithmetic.CrowdBucket(crowds))
    blobs = [bucket.__getstate__() for bucket in inputs]
    combine = CombineBucket(dense_limit=1 << 12)
    halves = []
    for pair in (inputs[:2], inputs[2:]):
        accumulator = None
        for bucket in pair:
            accumulator = combine.add_input(accumulator, pickle.loads(pickle.dumps(bucket)))
        halves.append(combine.compact(accumulator))
    opened = []
    monkeypatch.setattr(arithmetic.buckets, "_unpack", lambda blob: opened.append(blob))
    crossed = [pickle.loads(pickle.dumps(half)) for half in halves]
    assert [half.__getstate__() for half in crossed] == [
        (blobs[0], None, (blobs[1],)),
        (blobs[2], None, (blobs[3],)),
    ]
    merged = combine.merge_accumulators(crossed)
    assert merged.__getstate__() == (blobs[0], None, tuple(blobs[1:]))
    assert not opened  # nothing unpacked on the way
    monkeypatch.undo()
    reference = arithmetic.CrowdBucket()
    for bucket in inputs:
        reference.merge(bucket)
    reference.densify(1 << 12)
    assert _snapshot(combine.extract_output(merged)) == _snapshot(reference)
    assert len(reference) == 60


def test_row_units_number_units_in_the_order_of_their_first_crowd() -> None:
    """_row_units (numpy when the crowds share one window) numbers the units as a dict filled
    crowd by crowd would, for keys of one window and of several."""
    import random

    from transforms.analyzer.arithmetic import buckets as bk

    rng = random.Random(11)
    for case in range(200):
        windows = [("histogram", 0, 9)] if case % 2 else [("histogram", 0, 9), ("histogram", 9, 18)]
        keys = [(*rng.choice(windows), "ch", "r@1", f"c{i}") for i in range(rng.randint(1, 30))]
        crowd_buckets = [rng.randrange(5) for _ in keys]
        expected: dict = {}
        codes = [expected.setdefault((*key[:3], bucket), len(expected))
                 for key, bucket in zip(keys, crowd_buckets, strict=True)]  # fmt: skip
        index, found = bk._row_units(keys, crowd_buckets)
        assert list(index.items()) == list(expected.items())
        assert found.tolist() == codes
