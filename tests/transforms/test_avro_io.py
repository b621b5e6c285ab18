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


# ---------------------------------------------------------------------------------------------
# Vectorized reading of flat record schemas, checked against fastavro
# ---------------------------------------------------------------------------------------------

FLAT_SCHEMA = {
    "type": "record",
    "name": "Flat",
    "namespace": "test",
    "fields": [
        {"name": "tag", "type": "int"},
        {"name": "small", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "text", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "maybe_text", "type": ["null", "string"]},
        {"name": "maybe_long", "type": ["long", "null"]},
        {"name": "ratio", "type": "float"},
        {"name": "precise", "type": "double"},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["R", "G", "B"]}},
        {
            "name": "maybe_colour",
            "type": ["null", {"type": "enum", "name": "Shade", "symbols": ["LIGHT", "DARK"]}],
        },
    ],
}
_EDGE_INTS = [0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -(2**31)]
_EDGE_LONGS = [0, -1, 2**62, -(2**63), 2**63 - 1, 1_700_006_400_000]
_TEXT_LENGTHS = [0, 1, 63, 64, 200, 8191, 8192, 20_000]


def _flat_records(count: int, seed: int) -> list[dict]:
    """Records with every edge the encoding has: multi-byte and negative varints, lengths whose
    varint takes 1, 2 and 3 bytes, non-ASCII text, nulls in both union orders."""
    rng = np.random.default_rng(seed)
    records = []
    for index in range(count):
        text_length = int(rng.choice(_TEXT_LENGTHS, p=[0.2, 0.3, 0.2, 0.1, 0.1, 0.04, 0.03, 0.03]))
        records.append(
            {
                "tag": 1,
                "small": _EDGE_INTS[index % len(_EDGE_INTS)],
                "big": _EDGE_LONGS[index % len(_EDGE_LONGS)],
                "when": 1_700_006_400_000 + int(rng.integers(0, 86_400_000)),
                "text": ("é€x" * text_length)[:text_length],
                "blob": rng.bytes(int(rng.integers(0, 100))),
                "maybe_text": None if index % 3 == 0 else f"crowd-{index % 7}",
                "maybe_long": None if index % 4 == 1 else int(rng.integers(-(2**40), 2**40)),
                "ratio": float(np.float32(rng.normal())),
                "precise": float(rng.normal()),
                "colour": "RGB"[index % 3],
                "maybe_colour": None if index % 5 == 0 else ("LIGHT", "DARK")[index % 2],
            }
        )
    return records


def _container(records: list[dict], codec: str, sync_interval: int) -> bytes:
    buffer = io.BytesIO()
    schema = fastavro.parse_schema(FLAT_SCHEMA)
    fastavro.writer(buffer, schema, records, codec=codec, sync_interval=sync_interval)
    return buffer.getvalue()


def _blocks(data: bytes) -> list[tuple[bytes, int]]:
    """Decompressed contents and record counts of every block of a container file."""
    return [
        (block.bytes_.getvalue(), block.num_records)
        for block in fastavro.block_reader(io.BytesIO(data))
    ]


def _fastavro_batch(contents: list[bytes]) -> pa.RecordBatch:
    """The reference: fastavro's records of the blocks (logical types stripped) as a batch."""
    stripped = avro_io._strip_logical_types(FLAT_SCHEMA)
    parsed = fastavro.parse_schema(stripped)
    stream = io.BytesIO(b"".join(contents))
    records = []
    while stream.tell() < len(stream.getbuffer()):
        records.append(fastavro.schemaless_reader(stream, parsed, None))
    return avro_io.records_to_batch(records, stripped)


def _fast_batch(contents: list[bytes], counts: list[int]) -> pa.RecordBatch | None:
    layout = avro_io.flat_layout(avro_io._strip_logical_types(FLAT_SCHEMA))
    return avro_io.decode_flat_blocks(layout, contents, counts)


def test_flat_layout_covers_flat_schemas_only() -> None:
    layout = avro_io.flat_layout(avro_io._strip_logical_types(FLAT_SCHEMA))
    assert [field.kind for field in layout] == [
        "int", "int", "long", "long", "string", "bytes", "string", "long", "float", "double",
        "enum", "enum",
    ]  # fmt: skip
    assert avro_io.flat_layout(schema_json("report")) is not None
    nested = {"type": "record", "name": "N", "fields": [{"name": "a", "type": {"type": "array", "items": "int"}}]}  # fmt: skip
    assert avro_io.flat_layout(nested) is None
    three_way = {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["null", "int", "string"]}]}  # fmt: skip
    assert avro_io.flat_layout(three_way) is None


@pytest.mark.parametrize(("codec", "sync_interval"), [("null", 2000), ("deflate", 400_000)])
def test_vectorized_decoding_equals_fastavro(codec: str, sync_interval: int) -> None:
    # Small blocks (many per group) and a few large ones (long chains through one block).
    records = _flat_records(3000, seed=1)
    data = _container(records, codec, sync_interval)
    blocks = _blocks(data)
    contents, counts = [c for c, _ in blocks], [n for _, n in blocks]
    fast = _fast_batch(contents, counts)
    assert fast is not None  # the vectorized path decoded it (no fallback)
    expected = _fastavro_batch(contents)
    assert fast.schema == expected.schema
    assert fast.equals(expected)
    assert fast.column("text").to_pylist() == [r["text"] for r in records]
    assert fast.column("when").to_pylist() == [r["when"] for r in records]
    # The file reader gives the same rows in batches.
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(data, "f", 1000)))
    assert not chunks
    assert pa.Table.from_batches([b.columns for b in batches]).equals(
        pa.Table.from_batches([expected])
    )


def test_vectorized_decoding_rejects_what_it_cannot_vouch_for() -> None:
    records = _flat_records(600, seed=2)
    blocks = _blocks(_container(records, "null", 4000))
    contents, counts = [c for c, _ in blocks], [n for _, n in blocks]
    assert _fast_batch(contents, counts) is not None
    # A count that does not match the records in the block.
    assert _fast_batch(contents, [counts[0] + 1, *counts[1:]]) is None
    assert _fast_batch(contents, [counts[0] - 1, *counts[1:]]) is None
    assert _fast_batch(contents, [10**12, *counts[1:]]) is None  # no array of that size
    # Trailing bytes after the last record of a block.
    assert _fast_batch([contents[0] + b"\x00", *contents[1:]], counts) is None
    # Invalid UTF-8 in a string (fastavro rejects it too).
    text_record = [r for r in records if r["text"]][0]
    broken = _container([dict(text_record, text="x" * 10)], "null", 4000)
    ((content, count),) = _blocks(broken)
    position = content.index(b"x" * 10)
    assert _fast_batch([content[:position] + b"\xff" + content[position + 1 :]], [count]) is None


def test_vectorized_decoding_never_disagrees_with_fastavro_on_damaged_bytes() -> None:
    records = _flat_records(200, seed=3)
    blocks = _blocks(_container(records, "null", 3000))
    contents, counts = [c for c, _ in blocks], [n for _, n in blocks]
    rng = np.random.default_rng(4)
    decoded = rejected = 0
    for _ in range(100):
        block = int(rng.integers(len(contents)))
        damaged = bytearray(contents[block])
        damaged[int(rng.integers(len(damaged)))] = int(rng.integers(256))
        trial = [*contents[:block], bytes(damaged), *contents[block + 1 :]]
        fast = _fast_batch(trial, counts)
        if fast is None:
            rejected += 1
            continue
        # Whatever it accepts, fastavro reads the same way, record for record.
        decoded += 1
        assert fast.equals(_fastavro_batch(trial))
    assert decoded > 0 and rejected > 0


def test_unselective_record_beginnings_still_decode_correctly() -> None:
    # The first field takes many values, so record beginnings do not single out records; the
    # reader still returns fastavro's rows (vectorized or not).
    records = _flat_records(2000, seed=5)
    for index, record in enumerate(records):
        record["tag"] = (index * 7919) % 5000 - 2500
    data = _container(records, "deflate", 50_000)
    blocks = _blocks(data)
    contents = [c for c, _ in blocks]
    expected = _fastavro_batch(contents)
    fast = _fast_batch(contents, [n for _, n in blocks])
    assert fast is None or fast.equals(expected)
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(data)))
    assert not chunks
    assert pa.Table.from_batches([b.columns for b in batches]).equals(
        pa.Table.from_batches([expected])
    )


def test_nested_schemas_are_read_by_fastavro() -> None:
    schema = {
        "type": "record",
        "name": "Nested",
        "fields": [{"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}}],
    }  # fmt: skip
    records = [{"id": i, "tags": [str(i)] * (i % 3)} for i in range(50)]
    buffer = io.BytesIO()
    fastavro.writer(buffer, fastavro.parse_schema(schema), records)
    (item,) = list(avro_io.read_avro_batches_from_bytes(buffer.getvalue()))
    assert item.columns.column("tags").to_pylist() == [r["tags"] for r in records]


@pytest.mark.parametrize("codec", ["bzip2", "xz"])
def test_other_standard_library_codecs_are_read(codec: str) -> None:
    records = _records(300)
    data = rf.report_bytes(records, codec=codec, sync_interval=2000)
    assert len(_block_offsets(data)) > 1
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(data, "z", 100)))
    assert not chunks
    assert [batch.first_record for batch in batches] == list(
        np.cumsum([0] + [batch.rows for batch in batches[:-1]])
    )
    table = pa.Table.from_batches([batch.columns for batch in batches])
    assert table.column("origin").to_pylist() == [r["origin"] for r in records]
    assert table.column("event_time").to_pylist() == [r["event_time"] for r in records]


def test_bad_sync_marker_reports_exactly_the_bytes_skipped() -> None:
    records = _records(2000)
    data = bytearray(rf.report_bytes(records, codec="null", sync_interval=4000))
    blocks = list(fastavro.block_reader(io.BytesIO(bytes(data))))
    offsets = _block_offsets(bytes(data))
    data[offsets[2] - 1] ^= 0x01  # last byte of block 1's trailing sync marker
    batches, chunks = _split(list(avro_io.read_avro_batches_from_bytes(bytes(data), "s")))
    # Where block 1 ends is no longer certain: reading resumes after the next intact marker (the
    # end of block 2), the chunk holds exactly the skipped bytes and its record count is unknown.
    (chunk,) = chunks
    assert chunk.offset == offsets[1] and chunk.length == offsets[3] - offsets[1]
    assert chunk.raw == bytes(data[offsets[1] : offsets[3]]) and chunk.declared_records is None
    lost = blocks[1].num_records + blocks[2].num_records
    first = blocks[0].num_records
    kept = records[:first] + records[first + lost :]
    table = pa.Table.from_batches([b.columns for b in batches])
    assert table.column("origin").to_pylist() == [r["origin"] for r in kept]


def test_a_file_with_bad_magic_bytes_is_unreadable() -> None:
    content = b"Obj\x02" + b"\x00" * 30
    (item,) = list(avro_io.read_avro_batches_from_bytes(content, "m"))
    assert isinstance(item, avro_io.UnreadableChunk)
    assert item.reason == avro_io.UNREADABLE_FILE and item.offset == 0 and item.raw == content
