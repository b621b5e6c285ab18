"""Avro binary encoding and container files (schemas/avro/varint.py, encode.py, container.py),
checked byte for byte against fastavro and read back by fastavro and the Apache reference
library."""

from __future__ import annotations

import io
from pathlib import Path

import avro.datafile
import avro.io
import fastavro
import numpy as np
import pyarrow as pa
import pytest

from schemas import crc32c, parsed_schema, schema_json
from schemas.avro import encode, varint
from schemas.avro.container import (
    ByteStream,
    ContainerWriter,
    Corrupt,
    encode_container,
    header_bytes,
    records_in_blocks,
)
from schemas.avro.encode import encode_rows
from schemas.dead_letters import dead_letter
from tests.schemas.avro.hostile import corpus
from transforms.common import avro_io

REPORT = schema_json("report")
EDGES = [0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -(2**31), 2**62, -(2**63), 2**63 - 1]


@pytest.fixture(autouse=True, params=["numpy", "native"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test once with the numpy encoder and once with the compiled ``encode_rows``
    (``esa_avro_blocks``) where the fields allow it."""
    if request.param == "numpy":
        monkeypatch.setattr(encode, "_native_encode_rows", None)
    else:
        assert encode._native_encode_rows is not None, "esa_avro_blocks is not installed"
    return request.param


def test_varints_match_fastavro_for_every_length() -> None:
    values = np.array(EDGES + [1 << k for k in range(63)], dtype=np.int64)
    lengths, data = varint.varint_segments(values)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    for index, value in enumerate(values.tolist()):
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, "long", value)
        assert varint.encode_long(value) == expected.getvalue()
        assert data[offsets[index] : offsets[index + 1]].tobytes() == expected.getvalue()
    zigzag, ends, complete = varint.read_varints(
        np.append(data, np.zeros(10, np.uint8)), offsets[:-1]
    )
    assert complete and np.array_equal(ends, offsets[1:])
    assert np.array_equal(varint.unzigzag(zigzag), values)
    assert np.array_equal(varint.varint_ends(data, offsets[:-1]), offsets[1:])
    assert varint.encode_bytes("é") == b"\x04" + "é".encode()


def test_one_byte_varints_read_as_the_byte_by_byte_path_reads_them() -> None:
    """Positions whose varints are all one byte take the short path (their first bytes); any
    position, the last ones and past the end included (clipped), gives what the byte-by-byte
    reader gives, and one long varint among them sends all to the word path."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 0x80, size=64).astype(np.uint8)
    positions = np.array([0, 5, 62, 63, 64, 70])
    for buffer in (data, np.append(data, np.uint8(0x81))):
        got = varint.read_varints(buffer, positions)
        expected = varint._read_varints_bytewise(buffer, positions)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    data[7] = 0x85  # a two-byte varint at 7: the word path
    got = varint.read_varints(data, np.array([0, 7]))
    assert got[0].tolist() == [int(data[0]), (int(data[8]) << 7) | 5] and got[1].tolist() == [1, 9]
    empty = varint.read_varints(data, np.array([], dtype=np.int64))
    assert empty[0].size == 0 and empty[1].size == 0 and empty[2]


def _columns(records: list[dict]) -> dict[str, pa.Array]:
    return {name: pa.array([r[name] for r in records]) for name in records[0]}


def test_rows_are_byte_identical_to_fastavro() -> None:
    records = corpus.reports(300)
    records[5]["payload"] = b"\x00" * 20000  # a length whose varint takes three bytes
    records[6]["event_time"] = 2**62
    data, offsets = encode_rows(REPORT, _columns(records), len(records))
    schema = parsed_schema("report")
    for index, record in enumerate(records):
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, schema, record)
        assert data[offsets[index] : offsets[index + 1]].tobytes() == expected.getvalue()


def test_rows_after_a_prefix_are_the_whole_records() -> None:
    """``encode_rows(..., prefix=)``: each row's first fields given as encoded bytes (a
    release's crowd key, encoded once per crowd) and the rest encoded after them are the bytes
    of the whole records, constant fields among the rest included."""
    records = corpus.reports(200)
    columns = _columns(records)
    split = 6
    fields = REPORT["fields"]
    head, head_offsets = encode_rows({**REPORT, "fields": fields[:split]}, columns, len(records))
    prefix = pa.Array.from_buffers(
        pa.large_binary(), len(records), [None, pa.py_buffer(head_offsets), pa.py_buffer(head)]
    )
    tail_columns = {field["name"]: columns[field["name"]] for field in fields[split:]}
    tail_columns["payload_crc32c"] = 7  # one value for every row
    whole = {**columns, "payload_crc32c": 7}
    data, offsets = encode_rows(
        {**REPORT, "fields": fields[split:]}, tail_columns, len(records), prefix=prefix
    )
    expected_data, expected_offsets = encode_rows(REPORT, whole, len(records))
    assert np.array_equal(offsets, expected_offsets)
    assert np.array_equal(data, expected_data)


FLAT = {
    "type": "record",
    "name": "Flat",
    "fields": [
        {"name": "version", "type": "int"},
        {"name": "time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "name", "type": "string"},
        {"name": "maybe", "type": ["null", "string"], "default": None},
        {"name": "blob", "type": "bytes"},
        {"name": "number", "type": "long"},
    ],
}


def test_flat_rows_with_a_shared_prefix_are_byte_identical_to_fastavro(encoder: str) -> None:
    """Int, long, string and bytes columns, constants and a prefix picked per row from a few
    encodings (``prefix_index``): what the compiled writer takes, the same bytes either way."""
    rng = np.random.default_rng(9)
    rows = 400
    values = np.array(EDGES * (rows // len(EDGES) + 1))[:rows]
    names = ["", "é", "x" * 200] + [f"n{i}" for i in range(rows - 3)]
    blobs = pa.array([rng.bytes(int(n)) for n in rng.integers(0, 40, rows + 5)]).slice(5)
    heads = [b"", b"\x02", b"\x04ab"]  # encodings of a leading field: null, "", "ab" as unions
    index = rng.integers(0, len(heads), rows)
    columns = {
        "version": 3,
        "time": values,
        "name": pa.array(names),
        "maybe": None,
        "blob": blobs,
        "number": pa.array(values[::-1].copy()),
    }
    prefix = pa.array(heads, pa.binary())
    data, offsets = encode_rows(FLAT, columns, rows, prefix=prefix, prefix_index=index)
    if encoder == "native":  # every field is one the compiled writer takes
        assert encode._native_pieces(FLAT, columns, rows, prefix, index) is not None
    schema = fastavro.parse_schema(FLAT)
    for row in range(rows):
        expected = io.BytesIO()
        expected.write(heads[index[row]])
        record = {
            "version": 3,
            "time": int(values[row]),
            "name": names[row],
            "maybe": None,
            "blob": blobs[row].as_py(),
            "number": int(values[::-1][row]),
        }
        fastavro.schemaless_writer(expected, schema, record)
        assert data[offsets[row] : offsets[row + 1]].tobytes() == expected.getvalue(), row


def read_with_apache_avro(data: bytes) -> list[dict]:
    reader = avro.datafile.DataFileReader(io.BytesIO(data), avro.io.DatumReader())
    try:
        return [normalise(record) for record in reader]
    finally:
        reader.close()


def normalise(record: dict) -> dict:
    """Records as plain values (timestamps as int ms), whichever library read them."""
    out = dict(record)
    time = out["event_time"]
    if not isinstance(time, int):
        out["event_time"] = round(time.timestamp() * 1000)
    return out


@pytest.mark.parametrize("codec", ["deflate", "null"])
def test_streamed_files_are_read_by_fastavro_and_the_apache_reference_library(codec: str) -> None:
    first, second = corpus.reports(3000, seed=2), corpus.reports(10, seed=3)
    sink = io.BytesIO()
    writer = ContainerWriter(sink, REPORT, codec=codec, sync_marker=b"s" * 16, block_bytes=20_000)
    for records in (first, second):
        writer.write_encoded(*encode_rows(REPORT, _columns(records), len(records)))
    assert writer.records_written == 3010
    data = sink.getvalue()
    assert data.startswith(header_bytes(REPORT, codec, b"s" * 16))
    fast = fastavro.reader(io.BytesIO(data))
    assert fast.codec == codec
    assert [normalise(r) for r in fast] == first + second
    apache = read_with_apache_avro(data)
    assert apache == first + second
    assert all(crc32c(r["payload"]) == r["payload_crc32c"] for r in apache)
    # Blocks stay under block_bytes (one record at least), and the same sync writes the same bytes.
    found = corpus.blocks(data)
    assert len(found) > 2 and all(block.size <= 20_000 for block in found if codec == "null")
    again = encode_container(REPORT, _columns(first), len(first), codec, 20_000, b"s" * 16)
    assert again == data[: len(again)]


def test_writer_rejects_unknown_or_unavailable_codecs() -> None:
    with pytest.raises(ValueError, match="unknown codec"):
        ContainerWriter(io.BytesIO(), REPORT, codec="lzo")
    with pytest.raises(ValueError, match="16 bytes"):
        ContainerWriter(io.BytesIO(), REPORT, sync_marker=b"short")
    try:
        import cramjam  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="cramjam"):
            ContainerWriter(io.BytesIO(), REPORT, codec="snappy")


def test_columns_broadcast_constants_and_large_values() -> None:
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
    content = encode_container(schema_json("shuffled_message"), columns, 3)
    back = list(fastavro.reader(io.BytesIO(content)))
    assert [r["payload"] for r in back] == payloads.to_pylist()
    assert [r["crowd_id"] for r in back] == [None, "c", None]
    assert [r["payload_crc32c"] for r in back] == [0, 2**32 - 1, 12345]
    assert {r["channel"] for r in back} == {"é-channel"}


def test_write_avro_files_on_beam_filesystems(tmp_path: Path) -> None:
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


@pytest.mark.parametrize(("size", "start"), [(0, 0), (2000, 0), (2500, 100)])
def test_byte_stream_reads_to_the_end_in_pieces_and_releases_them(size: int, start: int) -> None:
    data = (bytes(range(256)) * 10)[:size]
    stream = ByteStream(io.BytesIO(data), read_chunk=300)
    pieces = list(stream.read_to_end(start, 1000))
    # Full pieces, then one short piece: empty when the file ends on a piece boundary.
    assert pieces == [
        (offset, data[offset : offset + 1000]) for offset in range(start, size + 1, 1000)
    ]
    assert stream.at_end()
    if size - start > 300:  # more than a read chunk behind the end: released, no rewind there
        with pytest.raises(ValueError, match="released"):
            stream.rewind(start)


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_block_headers_state_the_records_a_damaged_block_ends_the_walk(codec: str) -> None:
    records = corpus.reports(3000, seed=4)
    sink = io.BytesIO()
    writer = ContainerWriter(sink, REPORT, codec=codec, sync_marker=b"s" * 16, block_bytes=20_000)
    writer.write_encoded(*encode_rows(REPORT, _columns(records), len(records)))
    data = sink.getvalue()
    blocks = [block.num_records for block in fastavro.block_reader(io.BytesIO(data))]
    assert len(blocks) > 3 and records_in_blocks(io.BytesIO(data)) == 3000
    # Cut inside the last block: the complete blocks before it are counted, nothing after.
    assert records_in_blocks(io.BytesIO(data[:-20])) == 3000 - blocks[-1]
    # A wrong sync marker after the first block stops the walk there.
    first_sync = data.index(b"s" * 16, len(header_bytes(REPORT, codec, b"s" * 16)))
    broken = data[:first_sync] + b"x" * 16 + data[first_sync + 16 :]
    assert records_in_blocks(io.BytesIO(broken)) == 0
    with pytest.raises(Corrupt):
        records_in_blocks(io.BytesIO(b"not avro"))
