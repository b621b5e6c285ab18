"""The shuffler's step helpers and sinks (shuffle_steps, shuffle_sinks, shuffle_config) without a
pipeline, and the message sink's retry behaviour on a small one."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import apache_beam as beam
import fastavro
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from schemas.avro.reader import read_container_bytes
from schemas.release import commit as rel
from schemas.release.crowd_buckets import BucketKey, crowd_bucket
from schemas.release.crowd_tables import iter_crowds
from tests.transforms import report_factory as rf
from transforms.common import avro_io
from transforms.shuffler import decide, report_rows, sinks, spill, steps
from transforms.shuffler.config import metrics_summary

KEY = np.arange(1, 67, dtype=np.uint64) | np.uint64(1)


def _item(records: list[dict], first_record: int = 0) -> avro_io.ColumnBatch:
    batch = next(read_container_bytes(rf.report_bytes(records))).columns
    return avro_io.ColumnBatch("in.avro", first_record, batch)


def test_crowd_codes_number_the_crowds_present_in_text_order() -> None:
    dictionary = pa.array(["b|x|1", "unused|y|2", "a|z|3", "c|w|4"])
    indices = pa.array([3, 0, 0, 2, 3, 0], type=pa.int32())
    column = pa.DictionaryArray.from_arrays(indices, dictionary)
    codes, texts = steps.crowd_codes(column)
    assert texts == ["a|z|3", "b|x|1", "c|w|4"]  # sorted, without the unused entry
    assert [texts[code] for code in codes.tolist()] == column.to_pylist()
    chunked = pa.chunked_array([column.slice(0, 2), column.slice(2)])
    assert [texts[code] for code in steps.crowd_codes(chunked)[0].tolist()] == column.to_pylist()
    empty_codes, empty_texts = steps.crowd_codes(column.slice(0, 0))
    assert empty_codes.size == 0 and empty_texts == []


def test_bucket_rows_sort_by_bucket_and_hash_name_crowds_and_drop_the_origin() -> None:
    records = (
        rf.crowd(6, 2, prefix="a")
        + rf.crowd(4, 1, prefix="b", crowd_id="x")
        + rf.crowd(3, 1, prefix="c", crowd_id="y", instance=1)
    )
    item = _item(records)
    one = steps.bucket_rows(item.columns, report_rows.WindowSpec(), KEY, 1)
    assert one.rows.schema == spill.REPORT_SPILL_SCHEMA
    assert "origin" not in one.rows.schema.names  # the spill never holds a plaintext origin
    # One bucket per (window, instance): the crowds of instance 0 share one.
    assert one.keys == [BucketKey(rf.T0, 0, 0), BucketKey(rf.T0, 1, 0)]
    assert np.diff(one.starts).tolist() == [16, 3]
    hashes = one.rows.column("origin_hash").to_numpy()
    for begin, end in zip(one.starts[:-1], one.starts[1:], strict=True):
        assert np.all(np.diff(hashes[begin:end].astype(np.float64)) >= 0)
    # Each spilled row still knows its input record and crowd and hashes its own origin.
    index = one.rows.column("record_index").to_numpy()
    origins = pa.array([records[i]["origin"] for i in index])
    assert np.array_equal(hashes, report_rows.origin_hashes(origins, KEY))
    assert one.rows.column("payload").to_pylist() == [records[i]["payload"] for i in index]
    crowds = [spill.crowd_of_text(text) for text in one.rows.column("crowd").to_pylist()]
    assert crowds == [(rf.CHANNEL, rf.RECIPE, records[i]["crowd_id"]) for i in index]
    # Many buckets: every crowd in the bucket its digest names, rows grouped by bucket.
    many = steps.bucket_rows(item.columns, report_rows.WindowSpec(), KEY, 1000)
    expected = {
        (r["shuffler_instance"], crowd_bucket(rf.CHANNEL, rf.RECIPE, r["crowd_id"], 1000))
        for r in records
    }
    assert {(key.instance, key.bucket) for key in many.keys} == expected
    assert len(many.keys) == len(expected)
    texts = many.rows.column("crowd").to_pylist()
    for key, begin, end in zip(many.keys, many.starts[:-1], many.starts[1:], strict=True):
        for text in set(texts[begin:end]):
            assert crowd_bucket(*spill.crowd_of_text(text), 1000) == key.bucket


def test_screening_caps_each_origin_per_crowd_by_its_recipe() -> None:
    """One origin in two crowds of a bucket: each crowd applies its own recipe's cap."""
    routes = dict(rf.ROUTES)
    routes[rf.RECIPE] = report_rows.RecipeRoute(rf.CHANNEL, 2, origin_caps=(2, 2))
    routes[rf.OTHER_RECIPE] = report_rows.RecipeRoute(rf.CHANNEL, 2, origin_caps=(1, 1))
    rules = report_rows.ValidationRules(routes, frozenset({1}))
    records = [rf.report("o", f"p{i}".encode()) for i in range(4)] + [
        rf.report("o", f"q{i}".encode(), recipe_id=rf.OTHER_RECIPE) for i in range(3)
    ]
    records.append(rf.report("o", b""))  # a presence message of the first crowd
    keyed = steps.bucket_rows(_item(records).columns, report_rows.WindowSpec(), KEY, 1)
    screened = steps.screen(pa.Table.from_batches([keyed.rows]), rules, 0)
    assert screened.texts == sorted(screened.texts) and len(screened.texts) == 2
    codes = Counter(
        (screened.texts[crowd], int(code))
        for crowd, code in zip(screened.crowds, screened.codes, strict=True)
    )
    first = spill.crowd_text(rf.CHANNEL, rf.RECIPE, None)
    other = spill.crowd_text(rf.CHANNEL, rf.OTHER_RECIPE, None)
    assert codes == {
        (first, decide.DATA): 2,
        (first, decide.OVER_ORIGIN_CAP): 2,
        (first, decide.PRESENCE): 1,
        (other, decide.DATA): 1,
        (other, decide.OVER_ORIGIN_CAP): 2,
    }
    hashes = keyed.rows.column("origin_hash").to_numpy()
    assert steps.distinct_per_crowd(screened.crowds, hashes, 2).tolist() == [1, 1]


def test_origin_codes_rank_each_origin_within_its_crowd_as_unique_does() -> None:
    rng = np.random.default_rng(3)
    crowds = rng.integers(0, 5, size=2000)  # crowd 4 of 6 has rows, crowd 5 none
    crowds[crowds == 4] = 3
    hashes = rng.integers(0, 40, size=2000).astype(np.uint64) << np.uint64(58)
    distinct, codes = steps.origin_codes(crowds, hashes, 6)
    for crowd in range(6):
        members = crowds == crowd
        unique, inverse = np.unique(hashes[members], return_inverse=True)
        assert distinct[crowd] == unique.size
        assert codes[members].tolist() == inverse.reshape(-1).tolist()
    assert steps.distinct_per_crowd(crowds, hashes, 6).tolist() == distinct.tolist()
    empty = steps.origin_codes(crowds[:0], hashes[:0], 2)
    assert empty[0].tolist() == [0, 0] and empty[1].size == 0


def test_rejected_and_spilled_dead_letters_say_where_the_record_is() -> None:
    item = _item([rf.report("a"), rf.report("b", crc=5), rf.report("c", recipe_id="no@1")], 10)
    reasons = report_rows.validate_reports(item.columns, rf.rules())
    letters = steps.rejected_dead_letters(item, reasons, rf.rules())
    assert [(letter["reason"], letter["source"]) for letter in letters] == [
        ("crc_mismatch", "in.avro#record=11"),
        ("unknown_recipe", "in.avro#record=12"),
    ]
    keyed = steps.bucket_rows(item.columns, report_rows.WindowSpec(), KEY, 4)
    rows = keyed.rows.append_column(spill.PIECE_INDEX, pa.array([0, 0, 0]))
    spilled = steps.spilled_dead_letters(keyed.keys[0], rows, ["in.avro"], "s", "late_data", "d")
    record = json.loads(spilled[0]["original_record"])
    assert "origin" not in record and int(record["origin_hash"], 16) > 0
    assert (record["channel"], record["recipe_id"], record["crowd_id"]) == (
        rf.CHANNEL,
        rf.RECIPE,
        None,
    )
    assert {letter["source"] for letter in spilled} == {f"in.avro#record={i}" for i in (0, 1, 2)}


def _crowd(crowd_id: str, status: str, respondents: int | None, messages: int) -> dict:
    return {
        "window_start": rf.T0,
        "window_end": rf.T0 + rf.DAY_MS,
        "instance": 0,
        "channel": rf.CHANNEL,
        "recipe_id": rf.RECIPE,
        "crowd_id": crowd_id,
        "status": status,
        "respondents_released": respondents,
        "messages_released": messages,
    }


def test_a_retried_write_overwrites_and_the_release_commits(tmp_path: Path) -> None:
    """The same group and crowd table written twice (a retried bundle) leave one file and one
    index entry each; the commit record's totals come from the index entries only."""
    key = BucketKey(rf.T0, 0, 0)  # B = 1: every crowd in bucket 0
    crowds = ((rf.CHANNEL, rf.RECIPE, "c"), (rf.CHANNEL, rf.RECIPE, "d"))
    payloads = pa.array([b"a", b"bb", b"ccc"])
    group = sinks.ReleasedGroup(
        key, 0, rf.T0 + rf.DAY_MS, crowds, (1, 2), payloads, np.zeros(3, np.int64)
    )
    table = sinks.CrowdTable(
        key,
        (
            _crowd("c", "released", 2, 1),
            _crowd("d", "released", 5, 2),
            _crowd("w", "withheld", None, 0),
        ),
    )
    output, private = tmp_path / "out", tmp_path / "out.private"
    with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as pipeline:
        groups = pipeline | "Groups" >> beam.Create([group, group])
        _ = groups | sinks.WriteShuffledMessages(str(output), str(private))
        tables = pipeline | "Tables" >> beam.Create([table, table])
        _ = tables | sinks.WriteCrowdTables(str(output), str(private))
    assert [p.name for p in (output / "messages").iterdir()] == [f"{rf.T0}-u0-b00000-g00000.avro"]
    assert [p.name for p in (output / "crowds").iterdir()] == [f"{rf.T0}-u0-b00000.avro"]
    messages = _read(output / "messages" / f"{rf.T0}-u0-b00000-g00000.avro")
    assert [m["crowd_id"] for m in messages] == ["c", "d", "d"]
    assert [m["payload"] for m in messages] == [b"a", b"bb", b"ccc"]
    entries = sinks.read_index(str(private))
    assert [entry["records"] for entry in entries] == [3, 3]
    parameters = {"crowd_threshold": 2, "crowd_buckets": 1}
    record = sinks.commit_record(0, [rf.RECIPE], parameters, entries)
    assert "crowds" not in record and record["format"] == "esa-release/2"
    assert (record["records_released"], record["crowds_released"]) == (3, 2)
    assert (record["crowds_withheld"], record["respondents_released"]) == (1, 7)
    assert all(set(entry) == {"path", "bytes", "records", "sha256"} for entry in record["files"])
    rel.write_commit(str(output), record)
    verified = rel.verify_release(str(output))  # crowd tables and their messages included
    assert verified.records == 3
    assert [crowd["crowd_id"] for crowd in iter_crowds(verified)] == ["c", "d", "w"]


def _read(path: Path) -> list[dict]:
    with open(path, "rb") as handle:
        return list(fastavro.reader(handle))


def test_metrics_add_up_in_records_with_presence_and_refuse_unknown_counts() -> None:
    counts = {"read": 20, "released": 8, "deleted": 2, "withheld": 3, "presence": 5}
    counts["rejected:crc_mismatch"] = 2
    summary = metrics_summary(counts)
    assert summary["adds_up"] and summary["accounted"] == 20 and summary["presence"] == 5
    unknown = metrics_summary({**counts, "unknown_records:unreadable_file": 1})
    assert not unknown["adds_up"] and unknown["chunks_of_unknown_records"] == {"unreadable_file": 1}
    assert not metrics_summary(dict(counts, read=21))["adds_up"]


def test_shuffled_message_rows_are_the_bytes_of_the_columns_encoded_row_by_row() -> None:
    """Each crowd's leading fields encoded once and repeated give the same file bytes as every
    field encoded for every row, and fastavro reads the records back."""
    rng = np.random.default_rng(5)
    crowds = (("ch", "r@1", None), ("ch", "r@1", "a"), ("kanal-é", "r@2", "b" * 70))
    crowd_rows = (3, 1, 250)
    rows = sum(crowd_rows)
    payloads = pa.array([rng.bytes(int(n)) for n in rng.integers(0, 200, size=rows)], pa.binary())
    crcs = rng.integers(0, 2**32, size=rows)
    group = sinks.ReleasedGroup(
        BucketKey(1_704_067_200_000, 1, 7), 2, 1_704_153_600_000, crowds, crowd_rows, payloads, crcs
    )
    schema = sinks.schema_json("shuffled_message")
    data, offsets = sinks.shuffled_message_rows(group)
    expected_data, expected_offsets = sinks.encode_rows(schema, sinks.shuffled_columns(group), rows)
    assert offsets.tolist() == expected_offsets.tolist()
    assert data.tobytes() == expected_data.tobytes()
    content = sinks.encode_encoded_container(schema, data, offsets)
    records = list(fastavro.reader(io.BytesIO(content)))
    assert [(r["channel"], r["recipe_id"], r["crowd_id"]) for r in records] == [
        crowd for crowd, n in zip(crowds, crowd_rows, strict=True) for _ in range(n)
    ]
    assert [r["payload"] for r in records] == payloads.to_pylist()
    assert [r["payload_crc32c"] for r in records] == crcs.tolist()


def test_released_message_files_are_written_in_small_blocks_that_cut_into_even_ranges(
    tmp_path: Path,
) -> None:
    """A released file of 20,000 sealed-size messages is written in blocks of about
    MESSAGE_BLOCK_BYTES, so the ranges the analyzer reads at a share of 5,000 records are
    within a block of one another (with 1 MiB blocks they were 8,390 and 3,220 records)."""
    from schemas.avro.reader import block_windows

    rng = np.random.default_rng(9)
    rows = 20_000
    payloads = pa.array([rng.bytes(83) for _ in range(rows)], pa.binary())
    group = sinks.ReleasedGroup(
        BucketKey(rf.T0, 0, 0), 0, rf.T0 + rf.DAY_MS, ((rf.CHANNEL, rf.RECIPE, "c"),), (rows,),
        payloads, rng.integers(0, 2**32, size=rows),
    )  # fmt: skip
    path = tmp_path / "messages.avro"
    path.write_bytes(sinks.message_file(group, "deflate"))
    with open(path, "rb") as handle:
        blocks = [block.num_records for block in fastavro.block_reader(handle)]
    assert sum(blocks) == rows and len(blocks) > 4
    block_records = max(blocks)
    assert block_records * 125 <= sinks.MESSAGE_BLOCK_BYTES * 1.1  # ~125 bytes a message
    with open(path, "rb") as handle:
        windows = block_windows(handle, 5_000, sinks.schema_json("shuffled_message"))
    sizes = [records for _, _, _, records in windows]
    assert sum(sizes) == rows
    assert max(sizes[:-1]) - min(sizes[:-1]) <= block_records  # all but the file's tail
    assert max(sizes) <= 5_000


def _deletion(tmp_path: Path, origin_codes: list[int] | None, respondents: int) -> list:
    """DeleteAndScatter on one crowd of a shard whose candidates carry ``origin_codes`` (None:
    the shard's respondents of the crowd sent presence messages only)."""
    from transforms.shuffler import release

    text = spill.crowd_text(rf.CHANNEL, rf.RECIPE, None)
    candidates = None
    if origin_codes is not None:
        rows = len(origin_codes)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([b"p%d" % i for i in range(rows)]),
                pa.array(np.arange(rows, dtype=np.int64)),
                pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(rows, np.int32)), pa.array([text])
                ),
                pa.array(np.asarray(origin_codes, dtype=np.int64)),
            ],
            schema=spill.CANDIDATE_SPILL_SCHEMA,
        )
        path = str(tmp_path / "candidates.arrow")
        ((offset, length, _),) = spill.write_spill(path, [batch])
        candidates = spill.Piece(path, offset, length, rows, "", 0)
    task = spill.DeletionTask(
        spill.ShardTask(0, 0, spill.Piece("list", 0, 1, 1, "", 0)),
        spill.pack_texts([text]),
        spill.pack_ints([respondents]),
        spill.pack_ints([1]),
        0,
        candidates,
    )
    step = release.DeleteAndScatter(str(tmp_path))
    step.setup()
    return list(step.process(((1_704_067_200_000, 0, 3), task)))


def test_delete_and_scatter_deletes_whole_origins_of_the_candidates(tmp_path) -> None:
    outputs = _deletion(tmp_path, [0, 1, 2, 1, 0, 2, 2], respondents=4)  # origin 3: presence
    (shard,) = [output[1] for output in outputs if isinstance(output, tuple)]
    deleted = spill.unpack_ints(shard.messages_deleted).tolist()
    released = spill.unpack_ints(shard.messages_released).tolist()
    assert deleted[0] + released[0] == 7 and deleted[0] in (0, 2, 3)  # one whole origin


def test_delete_and_scatter_of_presence_only_respondents_releases_nothing(tmp_path) -> None:
    (counts, (_, shard)) = [
        o.value if hasattr(o, "tag") else o for o in _deletion(tmp_path, None, 2)
    ]
    assert counts == {} and not shard.pieces
    assert spill.unpack_ints(shard.messages_released).tolist() == [0]


def test_delete_and_scatter_refuses_candidates_beyond_the_counted_origins(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="spill files changed"):
        _deletion(tmp_path, [0, 1, 2], respondents=2)
