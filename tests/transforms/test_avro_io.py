"""Avro column-batch reading and vectorized writing (transforms/avro_io.py)."""

from __future__ import annotations

import io
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from schemas import parsed_schema, schema_json
from schemas.records import dead_letter
from tests.transforms import report_factory as rf
from transforms import avro_io


def _records(count: int) -> list[dict]:
    return rf.crowd(count, 1, crowd_id="c") + [rf.report("solo", b"\x00\x01", crowd_id=None)]


def _split(items: list) -> tuple[list[avro_io.ColumnBatch], list[avro_io.UnreadableChunk]]:
    batches = [item for item in items if isinstance(item, avro_io.ColumnBatch)]
    chunks = [item for item in items if isinstance(item, avro_io.UnreadableChunk)]
    return batches, chunks


def _block_offsets(data: bytes) -> list[int]:
    return [block.offset for block in fastavro.block_reader(io.BytesIO(data))]


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_reads_every_record_in_column_batches(codec: str) -> None:
    records = _records(3000)
    data = rf.report_bytes(records, codec=codec, sync_interval=2000)
    batches, chunks = _split(
        list(avro_io.read_avro_batches_from_bytes(data, "mem", batch_records=1000))
    )
    assert not chunks
    assert all(1000 <= batch.rows < 1200 for batch in batches[:-1])
    assert [batch.first_record for batch in batches] == list(
        np.cumsum([0] + [batch.rows for batch in batches[:-1]])
    )
    table = pa.Table.from_batches([batch.columns for batch in batches])
    assert table.num_rows == len(records)
    assert table.column("origin").to_pylist() == [r["origin"] for r in records]
    assert table.column("payload").to_pylist() == [r["payload"] for r in records]
    assert table.column("crowd_id").to_pylist() == [r["crowd_id"] for r in records]
    # timestamp-millis is read as its int of milliseconds.
    assert table.schema.field("event_time").type == pa.int64()
    assert table.column("event_time").to_pylist() == [r["event_time"] for r in records]
    assert table.schema.field("shuffler_instance").type == pa.int32()


def test_reads_from_a_path(tmp_path: Path) -> None:
    path = rf.write_reports(tmp_path / "r.avro", _records(10))
    batches, chunks = _split(list(avro_io.read_avro_batches(path)))
    assert not chunks and sum(b.rows for b in batches) == 11 and batches[0].source == path
    assert avro_io.read_writer_schema(path)["name"] == "esa.Report"


def test_truncated_file_keeps_good_blocks() -> None:
    records = _records(2000)
    data = rf.report_bytes(records, sync_interval=4000)
    offsets = _block_offsets(data)
    cut = offsets[3] + 50  # inside the fourth block
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(data[:cut], "t")))
    good = sum(b.rows for b in batches)
    assert 0 < good < len(records)
    assert len(chunks) == 1 and chunks[0].reason == avro_io.CORRUPT_BLOCK
    assert chunks[0].offset == offsets[3] and chunks[0].raw == data[offsets[3] : cut]
    assert chunks[0].position == f"t@{offsets[3]}"


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_corrupt_block_is_isolated_and_reading_resumes(codec: str) -> None:
    records = _records(3000)
    data = bytearray(rf.report_bytes(records, codec=codec, sync_interval=4000))
    offsets = _block_offsets(bytes(data))
    # Overwrite the middle of the third block's data with a run of bytes no record decodes.
    middle = (offsets[2] + offsets[3]) // 2
    data[middle : middle + 40] = b"\xff" * 40
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(bytes(data), "c", 500)))
    assert [chunk.reason for chunk in chunks] == [avro_io.CORRUPT_BLOCK]
    assert chunks[0].offset == offsets[2] and chunks[0].declared_records is not None
    rows = sum(b.rows for b in batches)
    table = pa.Table.from_batches([b.columns for b in batches])
    assert table.column("origin")[-1].as_py() == "solo"  # blocks after the bad one are read
    assert rows + chunks[0].declared_records == len(records)


def test_bad_sync_marker_resyncs() -> None:
    records = _records(2000)
    data = bytearray(rf.report_bytes(records, sync_interval=4000))
    offsets = _block_offsets(bytes(data))
    data[offsets[2] - 3] ^= 0xFF  # last bytes of block 1's trailing sync marker
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(bytes(data), "s")))
    assert len(chunks) == 1 and chunks[0].offset == offsets[1]
    assert sum(b.rows for b in batches) < len(records)
    assert (
        pa.Table.from_batches([b.columns for b in batches]).column("origin")[-1].as_py() == "solo"
    )


@pytest.mark.parametrize("content", [b"", b"garbage that is not avro", b"Obj\x01\x02"])
def test_unreadable_files_become_chunks(content: bytes) -> None:
    items = list(avro_io.read_avro_batches_from_bytes(content, "u"))
    assert len(items) == 1 and isinstance(items[0], avro_io.UnreadableChunk)
    assert items[0].reason == avro_io.UNREADABLE_FILE and items[0].raw == content


def test_missing_file_is_unreadable(tmp_path: Path) -> None:
    items = list(avro_io.read_avro_batches(str(tmp_path / "missing.avro")))
    assert len(items) == 1 and items[0].reason == avro_io.UNREADABLE_FILE


def test_other_schemas_read_too() -> None:
    buffer = io.BytesIO()
    letters = [
        dead_letter("s", "r", "d", "src", original_bytes=b"\x01"),
        dead_letter("s", "r", "d", "src"),
    ]
    fastavro.writer(buffer, parsed_schema("dead_letter"), letters)
    (item,) = list(avro_io.read_avro_batches_from_bytes(buffer.getvalue()))
    assert item.columns.column("original_bytes").to_pylist() == [b"\x01", None]


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_vectorized_writer_round_trips(codec: str) -> None:
    records = _records(500)
    columns = {name: pa.array([r[name] for r in records]) for name in records[0]}
    content = avro_io.encode_container(
        schema_json("report"), columns, len(records), codec, block_bytes=4096
    )
    back = list(fastavro.reader(io.BytesIO(content)))
    assert len(back) == len(records)
    for original, decoded in zip(records, back, strict=True):
        decoded["event_time"] = int(decoded["event_time"].timestamp() * 1000)
        assert decoded == original
    assert len(_block_offsets(content)) > 1


def test_vectorized_writer_broadcasts_constants_and_large_values() -> None:
    payloads = pa.array([b"", b"x" * 300, b"\x00" * 20000])
    columns = {
        "schema_version": 1,
        "window_start": 2**40,
        "window_end": 2**40 + 1,
        "channel": "é-channel",
        "recipe_id": "r@1",
        "crowd_id": pa.array([None, "c", None]),
        "payload": payloads,
        "payload_crc32c": np.array([0, 2**32 - 1, 12345]),
    }
    content = avro_io.encode_container(schema_json("shuffled_message"), columns, 3)
    back = list(fastavro.reader(io.BytesIO(content)))
    assert [r["payload"] for r in back] == payloads.to_pylist()
    assert [r["crowd_id"] for r in back] == [None, "c", None]
    assert [r["payload_crc32c"] for r in back] == [0, 2**32 - 1, 12345]
    assert {r["channel"] for r in back} == {"é-channel"}


def test_write_avro_files(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "m.avro")
    columns = {"payload": pa.array([b"a", b"b"]), "payload_crc32c": np.array([1, 2])}
    columns |= {
        "schema_version": 1,
        "window_start": 0,
        "window_end": 1,
        "channel": "c",
        "recipe_id": "r",
    }
    avro_io.write_avro_columns(path, schema_json("shuffled_message"), columns, 2)
    assert [r["payload"] for r in fastavro.reader(open(path, "rb"))] == [b"a", b"b"]
    letters = [dead_letter("s", "r", "d", "x")]
    other = str(tmp_path / "d.avro")
    assert avro_io.write_avro(other, parsed_schema("dead_letter"), letters) == 1
    assert list(fastavro.reader(open(other, "rb"))) == letters


def test_long_unreadable_region_comes_out_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(avro_io, "MAX_RAW_BYTES", 1000)
    monkeypatch.setattr(avro_io, "_READ_CHUNK", 700)
    data = rf.report_bytes(_records(3000), sync_interval=20000)
    offsets = _block_offsets(data)
    cut = offsets[1] + 5000  # the second block is truncated: 5000 bytes to the end
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(data[:cut])))
    assert len(chunks) == 5 and all(len(chunk.raw) <= 1000 for chunk in chunks)
    assert b"".join(chunk.raw for chunk in chunks) == data[offsets[1] : cut]
    assert [chunk.offset for chunk in chunks] == list(range(offsets[1], cut, 1000))
    garbage = bytes(range(256)) * 10
    chunks = list(avro_io.read_avro_batches_from_bytes(garbage))
    assert b"".join(chunk.raw for chunk in chunks) == garbage and len(chunks) == 3
