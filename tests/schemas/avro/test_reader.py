"""Avro container files as column batches and unreadable chunks (schemas/avro/reader.py)."""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from schemas import parsed_schema, schema_json
from schemas.avro import container, reader
from schemas.avro.reader import ColumnBatch, UnreadableChunk, read_container_bytes
from schemas.dead_letters import dead_letter
from tests.schemas.avro.hostile import corpus
from transforms.common import avro_io

REPORT = schema_json("report")


def _records(count: int) -> list[dict]:
    solo = dict(corpus.reports(1, seed=9)[0], origin="solo", crowd_id=None)
    return corpus.reports(count) + [solo]


def _file(records: list[dict], codec: str = "null", sync: int = 4000) -> bytes:
    return corpus.fastavro_file(REPORT, records, codec, sync)


def _split(items: list) -> tuple[list[ColumnBatch], list[UnreadableChunk]]:
    batches = [item for item in items if isinstance(item, ColumnBatch)]
    chunks = [item for item in items if isinstance(item, UnreadableChunk)]
    return batches, chunks


def _offsets(data: bytes) -> list[int]:
    return [block.offset for block in corpus.blocks(data)]


@pytest.mark.parametrize("codec", ["null", "deflate", "bzip2", "xz"])
def test_reads_every_record_in_column_batches(codec: str) -> None:
    records = _records(3000)
    data = _file(records, codec, 2000)
    batches, chunks = _split(list(read_container_bytes(data, "mem", batch_records=1000)))
    assert not chunks
    assert all(1000 <= batch.rows < 1200 for batch in batches[:-1])
    assert [batch.first_record for batch in batches] == list(
        np.cumsum([0] + [batch.rows for batch in batches[:-1]])
    )
    table = pa.Table.from_batches([batch.columns for batch in batches])
    assert table.num_rows == len(records)
    for name in ("origin", "payload", "crowd_id", "event_time"):
        assert table.column(name).to_pylist() == [r[name] for r in records]
    # timestamp-millis is read as its int of milliseconds.
    assert table.schema.field("event_time").type == pa.int64()
    assert table.schema.field("shuffler_instance").type == pa.int32()


def test_reads_from_a_path_and_a_missing_path_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "r.avro"
    path.write_bytes(_file(_records(10)))
    batches, chunks = _split(list(avro_io.read_avro_batches(str(path))))
    assert not chunks and sum(b.rows for b in batches) == 11 and batches[0].source == str(path)
    assert avro_io.read_writer_schema(str(path))["name"] == "esa.Report"
    (item,) = list(avro_io.read_avro_batches(str(tmp_path / "missing.avro")))
    assert item.reason == reader.UNREADABLE_FILE and item.records is None


def test_truncated_file_keeps_good_blocks_and_counts_the_cut_one() -> None:
    records = _records(2000)
    data = _file(records)
    found = corpus.blocks(data)
    cut = found[3].offset + 50  # inside the fourth block
    batches, chunks = _split(list(read_container_bytes(data[:cut], "t")))
    assert sum(b.rows for b in batches) == sum(block.count for block in found[:3])
    (chunk,) = chunks
    assert chunk.reason == reader.CORRUPT_BLOCK and chunk.records == found[3].count
    assert chunk.offset == found[3].offset and chunk.raw == data[found[3].offset : cut]
    assert chunk.position == f"t@{found[3].offset}"


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_corrupt_block_is_isolated_and_reading_resumes(codec: str) -> None:
    records = _records(3000)
    data = bytearray(_file(records, codec))
    found = corpus.blocks(bytes(data))
    # Overwrite the middle of the third block's data with a run of bytes no record decodes.
    middle = found[2].offset + found[2].header + found[2].size // 2
    data[middle : middle + 40] = b"\xff" * 40
    batches, chunks = _split(list(read_container_bytes(bytes(data), "c", 500)))
    assert [chunk.reason for chunk in chunks] == [reader.CORRUPT_BLOCK]
    assert chunks[0].offset == found[2].offset and chunks[0].records == found[2].count
    table = pa.Table.from_batches([b.columns for b in batches])
    assert table.column("origin")[-1].as_py() == "solo"  # blocks after the bad one are read
    assert table.num_rows + chunks[0].records == len(records)


def test_one_damaged_byte_in_a_sync_marker_costs_only_the_block_before_it() -> None:
    records = _records(2000)
    data = bytearray(_file(records))
    found = corpus.blocks(bytes(data))
    data[found[1].end - 1] ^= 0x01  # last byte of block 1's trailing sync marker
    batches, chunks = _split(list(read_container_bytes(bytes(data), "s")))
    (chunk,) = chunks
    assert chunk.offset == found[1].offset and chunk.length == found[1].end - found[1].offset
    assert chunk.records == found[1].count and "sync marker" in chunk.detail
    first = found[0].count
    kept = records[:first] + records[first + found[1].count :]
    table = pa.Table.from_batches([b.columns for b in batches])
    assert table.column("origin").to_pylist() == [r["origin"] for r in kept]


def test_a_destroyed_sync_marker_resyncs_with_records_unknown() -> None:
    records = _records(2000)
    data = bytearray(_file(records))
    found = corpus.blocks(bytes(data))
    data[found[1].end - 16 : found[1].end] = bytes(16)
    batches, chunks = _split(list(read_container_bytes(bytes(data), "s")))
    # Where block 1 ends is no longer certain: reading resumes after the next intact marker (the
    # end of block 2); the chunk holds exactly the skipped bytes and its record count is unknown.
    (chunk,) = chunks
    assert chunk.offset == found[1].offset and chunk.length == found[2].end - found[1].offset
    assert chunk.raw == bytes(data[found[1].offset : found[2].end]) and chunk.records is None
    assert sum(b.rows for b in batches) == len(records) - found[1].count - found[2].count


@pytest.mark.parametrize(
    "content", [b"", b"garbage that is not avro", b"Obj\x01\x02", b"Obj\x02" + bytes(30)]
)
def test_unreadable_files_become_one_chunk_of_unknown_records(content: bytes) -> None:
    (item,) = list(read_container_bytes(content, "u"))
    assert isinstance(item, UnreadableChunk) and item.reason == reader.UNREADABLE_FILE
    assert item.raw == content and item.offset == 0 and item.records is None
    assert "unknown records" in item.dead_letter("stage")["detail"]


def test_other_schemas_read_too() -> None:
    buffer = io.BytesIO()
    letters = [
        dead_letter("s", "r", "d", "src", original_bytes=b"\x01"),
        dead_letter("s", "r", "d", "src"),
    ]
    fastavro.writer(buffer, parsed_schema("dead_letter"), letters)
    (item,) = list(read_container_bytes(buffer.getvalue()))
    assert item.columns.column("original_bytes").to_pylist() == [b"\x01", None]
    schema = {
        "type": "record",
        "name": "Nested",
        "fields": [{"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}}],
    }  # fmt: skip
    nested = [{"id": i, "tags": [str(i)] * (i % 3)} for i in range(50)]
    (item,) = list(read_container_bytes(corpus.fastavro_file(schema, nested)))
    assert item.columns.column("tags").to_pylist() == [r["tags"] for r in nested]


def test_long_unreadable_regions_come_out_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_RAW_BYTES", 1000)
    data = _file(_records(3000), sync=20000)
    found = corpus.blocks(data)
    cut = found[1].offset + 5000  # the second block is truncated: 5000 bytes to the end
    items = list(reader.read_container(io.BytesIO(data[:cut]), "p", read_chunk=700))
    _, chunks = _split(items)
    assert len(chunks) == 5 and all(len(chunk.raw) <= 1000 for chunk in chunks)
    assert b"".join(chunk.raw for chunk in chunks) == data[found[1].offset : cut]
    assert [chunk.offset for chunk in chunks] == list(range(found[1].offset, cut, 1000))
    assert [chunk.records for chunk in chunks] == [found[1].count, 0, 0, 0, 0]
    garbage = bytes(range(256)) * 10
    chunks = list(reader.read_container(io.BytesIO(garbage), "g", read_chunk=700))
    assert b"".join(chunk.raw for chunk in chunks) == garbage and len(chunks) == 3


def test_expected_schema_projects_promotes_and_defaults() -> None:
    schema = corpus.report_schema(crowd_id=None, payload_crc32c="int", extra="string")
    records = [
        {k: v for k, v in r.items() if k != "crowd_id"} | {"payload_crc32c": 7, "extra": "x"}
        for r in corpus.reports(20)
    ]
    data = corpus.apache_file(schema, records)
    (item,) = list(read_container_bytes(data, expect=REPORT))
    assert item.columns.schema.names == [field["name"] for field in REPORT["fields"]]
    assert item.columns.schema.field("payload_crc32c").type == pa.int64()
    assert item.columns.column("crowd_id").null_count == 20
    assert item.columns.column("payload_crc32c").to_pylist() == [7] * 20


def test_a_file_whose_schema_does_not_resolve_is_dead_lettered_whole() -> None:
    schema = corpus.report_schema(origin=None)
    records = [{k: v for k, v in r.items() if k != "origin"} for r in corpus.reports(120)]
    data = corpus.apache_file(schema, records, block=50)
    (chunk,) = list(read_container_bytes(data, "m", expect=REPORT))
    assert chunk.reason == reader.SCHEMA_MISMATCH and chunk.records == 120
    assert chunk.raw == data and chunk.offset == 0
    assert chunk.detail == "not readable as Report: field 'origin' is missing"


@pytest.mark.parametrize("inflate", ["isal", "zlib"])  # ISA-L, and zlib where it is missing
def test_a_block_that_inflates_too_far_is_corrupt(
    monkeypatch: pytest.MonkeyPatch, inflate: str
) -> None:
    records = _records(500)
    data = _file(records, "deflate")
    if inflate == "zlib":
        monkeypatch.setattr(container, "_inflate", zlib)
    monkeypatch.setattr(container, "MAX_DECOMPRESSED_BYTES", 1000)  # every block inflates more
    batches, chunks = _split(list(read_container_bytes(data, "b")))
    assert not batches and all("inflates to more than 1000" in chunk.detail for chunk in chunks)
    assert sum(chunk.records for chunk in chunks) == len(records)


def test_one_writer_schema_is_worked_out_once_per_expected_schema() -> None:
    """Files of one writer schema and codec share their header's plan (a release's files, read
    range by range); read as another schema, the same header is judged again, not looked up:
    the cache is keyed by what is expected too."""
    data = _file(_records(20))
    header = container.read_header(container.ByteStream(io.BytesIO(data)))
    again = container.read_header(container.ByteStream(io.BytesIO(_file(_records(5)))))
    plan = reader._file_problem(header, REPORT)
    assert plan.reason == "" and plan.layout is not None
    assert reader._file_problem(again, REPORT) is plan
    other = reader._file_problem(header, schema_json("shuffled_message"))
    assert other.reason == reader.SCHEMA_MISMATCH and "ShuffledMessage" in other.detail
    batches, chunks = _split(list(read_container_bytes(data, "mem", expect=REPORT)))
    assert not chunks and sum(batch.rows for batch in batches) == 21
    (chunk,) = list(read_container_bytes(data, "mem", expect=schema_json("shuffled_message")))
    assert isinstance(chunk, UnreadableChunk) and chunk.reason == reader.SCHEMA_MISMATCH


def test_isal_and_zlib_inflate_every_block_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from isal import isal_zlib

    assert container._inflate is isal_zlib  # installed with the project (setup.py)
    data = _file(_records(3000), "deflate")
    with_isal = _split(list(read_container_bytes(data, "f", 700)))
    monkeypatch.setattr(container, "_inflate", zlib)
    with_zlib = _split(list(read_container_bytes(data, "f", 700)))
    assert [b.columns for b in with_isal[0]] == [b.columns for b in with_zlib[0]]
    assert with_isal[0] and not with_isal[1] and not with_zlib[1]


def test_block_windows_are_as_few_and_as_even_as_whole_blocks_allow() -> None:
    """As few windows of whole blocks as max_records allows (W: as many as filling each while
    it fits makes), contiguous, the largest at most ceil(records / W) plus one block (filling
    alone gave full windows and a small tail: a worker handed the tails did less work than
    one handed full windows)."""
    data = _file(_records(3000), sync=4000)
    counts = [block.count for block in corpus.blocks(data)]
    total, largest_block = sum(counts), max(counts)
    assert len(counts) > 20
    for max_records in (largest_block, 2 * largest_block + 1, 700, 1234, total - 1, total, 10**9):
        windows = reader.block_windows(io.BytesIO(data), max_records, REPORT)
        sizes = [records for _, _, _, records in windows]
        wanted = len(reader._run_ends(counts, max_records))  # the fewest
        assert wanted >= -(-total // max_records)
        assert len(windows) == wanted and sum(sizes) == total
        assert max(sizes) <= min(max_records, -(-total // wanted) + largest_block - 1)
        for (_, stop, first, records), (start, _, following, _) in zip(
            windows, windows[1:], strict=False
        ):
            assert stop == start and first + records == following
    # A block larger than max_records is a window of its own.
    windows = reader.block_windows(io.BytesIO(data), 1, REPORT)
    assert [records for _, _, _, records in windows] == counts
