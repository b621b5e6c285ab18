"""Avro files in and out as column batches, for any of the project's schemas.

Reading walks the Avro object container format (Avro 1.11 specification, "Object Container
Files") block by block: header, then blocks of ``count, size, data, sync marker``. Good blocks are
gathered until a batch holds about ``batch_records`` records and decoded together into one Arrow
RecordBatch (one column per top-level field). Flat record schemas (every field a primitive, an
enum or a ``[null, T]`` union of one; all of the project's message schemas) are decoded with
numpy, all records at once (:func:`decode_flat_blocks`, checked exactly); other schemas, other
codecs and any group of blocks that check fails are decoded by fastavro, one call per group. A
file or block that cannot be read does not stop the reader: it becomes an
:class:`UnreadableChunk` with its byte position and raw bytes, the reader finds the next sync
marker and goes on. Nothing is skipped silently.

Logical types are read as their underlying values (``timestamp-millis`` stays an int of ms): the
shuffler and analyzer compute with numbers, and converting every value to ``datetime`` costs more
than decoding it.

Files are opened with Beam's ``FileSystems``, so paths may be local or on any filesystem Beam
knows; a file is streamed, never held whole in memory.
"""

from __future__ import annotations

import copy
import io
import json
import operator
import os
import typing
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas.records import dead_letter

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
DEFAULT_BATCH_RECORDS = 50_000
# Raw bytes kept per dead-letter chunk; a longer unreadable region becomes several chunks.
MAX_RAW_BYTES = 8 << 20
# Blocks declaring more than this are treated as corrupt (fastavro writes blocks of ~16 kB).
MAX_BLOCK_BYTES = 1 << 30
_READ_CHUNK = 1 << 20

UNREADABLE_FILE = "unreadable_file"
CORRUPT_BLOCK = "corrupt_block"


@dataclass(frozen=True)
class ColumnBatch:
    """Records ``first_record .. first_record + rows - 1`` of ``source`` as Arrow columns."""

    source: str
    first_record: int
    columns: pa.RecordBatch

    @property
    def rows(self) -> int:
        return self.columns.num_rows


@dataclass(frozen=True)
class UnreadableChunk:
    """Bytes ``offset .. offset + length - 1`` of ``source`` that could not be decoded."""

    source: str
    offset: int
    length: int
    reason: str
    detail: str
    raw: bytes
    declared_records: int | None = None

    @property
    def position(self) -> str:
        return f"{self.source}@{self.offset}"

    def dead_letter(self, stage: str) -> dict[str, Any]:
        """The dead-letter record (schemas/dead_letter.avsc) for these bytes, rejected by stage."""
        records = "" if self.declared_records is None else f", {self.declared_records} records"
        return dead_letter(
            stage,
            self.reason,
            f"{self.detail} ({self.length} bytes{records})",
            self.position,
            original_bytes=self.raw,
        )


class _Corrupt(Exception):
    """The bytes at the current position are not a valid header or block."""


class _Truncated(_Corrupt):
    """The file ends inside a header or block."""


class _ByteStream:
    """Forward-only buffered reader with absolute positions and rewind within the buffer."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._file = fileobj
        self._buffer = bytearray()
        self._buffer_start = 0  # file position of self._buffer[0]
        self._index = 0  # read position inside self._buffer
        self._eof = False

    @property
    def position(self) -> int:
        return self._buffer_start + self._index

    def _fill(self, needed: int) -> bool:
        while len(self._buffer) - self._index < needed and not self._eof:
            chunk = self._file.read(max(_READ_CHUNK, needed))
            if not chunk:
                self._eof = True
            else:
                self._buffer += chunk
        return len(self._buffer) - self._index >= needed

    def at_end(self) -> bool:
        return not self._fill(1)

    def release_before(self, position: int) -> None:
        """Forget the bytes before ``position`` (no rewind behind it any more)."""
        drop = position - self._buffer_start
        if drop > _READ_CHUNK:
            del self._buffer[:drop]
            self._buffer_start += drop
            self._index -= drop

    def rewind(self, position: int) -> None:
        if position < self._buffer_start:
            raise ValueError("cannot rewind behind released bytes")
        self._index = position - self._buffer_start

    def read_exact(self, count: int) -> bytes:
        if not self._fill(count):
            raise _Truncated(f"file ends {count - (len(self._buffer) - self._index)} bytes short")
        chunk = bytes(self._buffer[self._index : self._index + count])
        self._index += count
        return chunk

    def read_up_to(self, count: int) -> bytes:
        self._fill(count)
        chunk = bytes(self._buffer[self._index : self._index + count])
        self._index += len(chunk)
        return chunk

    def read_long(self) -> int:
        """An Avro long: zig-zag varint of at most 10 bytes."""
        shift = 0
        value = 0
        for _ in range(10):
            if not self._fill(1):
                raise _Truncated("file ends inside a varint")
            byte = self._buffer[self._index]
            self._index += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise _Corrupt("varint longer than 10 bytes")

    def read_bytes(self) -> bytes:
        length = self.read_long()
        if length < 0 or length > MAX_BLOCK_BYTES:
            raise _Corrupt(f"invalid length {length}")
        return self.read_exact(length)

    def _pieces(self, begin: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Bytes [begin, end) of the buffer in pieces of at most MAX_RAW_BYTES."""
        for offset in range(begin, end, MAX_RAW_BYTES):
            stop = min(offset + MAX_RAW_BYTES, end)
            yield (
                offset,
                bytes(self._buffer[offset - self._buffer_start : stop - self._buffer_start]),
            )

    def scan_for(self, marker: bytes, start: int) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, piece)``: the bytes from ``start`` up to and including the next
        ``marker`` (or to the end of the file), in pieces of at most MAX_RAW_BYTES; afterwards
        the stream is positioned after the marker (or at the end)."""
        self.rewind(start)
        piece_start = start
        search_from = start + 1
        while True:
            local = self._buffer.find(marker, search_from - self._buffer_start)
            if local >= 0:
                end = self._buffer_start + local + len(marker)
                yield from self._pieces(piece_start, end)
                self._index = end - self._buffer_start
                return
            available_end = self._buffer_start + len(self._buffer)
            if self._eof:
                yield from self._pieces(piece_start, available_end)
                self._index = len(self._buffer)
                return
            # Emit whole pieces that cannot hold the start of a marker; keep the rest buffered.
            while available_end - piece_start >= MAX_RAW_BYTES + len(marker):
                yield from self._pieces(piece_start, piece_start + MAX_RAW_BYTES)
                piece_start += MAX_RAW_BYTES
            self._index = piece_start - self._buffer_start
            self.release_before(piece_start)
            search_from = max(piece_start + 1, available_end - len(marker) + 1)
            self._index = len(self._buffer)
            self._fill(1)


def _encode_long(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_bytes(value: bytes) -> bytes:
    return _encode_long(len(value)) + value


def _strip_logical_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            key: _strip_logical_types(value)
            for key, value in schema.items()
            if key != "logicalType"
        }
    if isinstance(schema, list):
        return [_strip_logical_types(item) for item in schema]
    return schema


def _header_bytes(schema_json: Any, codec: bytes, sync: bytes) -> bytes:
    entries = [(b"avro.schema", json.dumps(schema_json).encode()), (b"avro.codec", codec)]
    body = _encode_long(len(entries)) + b"".join(
        _encode_bytes(key) + _encode_bytes(value) for key, value in entries
    )
    return MAGIC + body + _encode_long(0) + sync


_PRIMITIVE_ARROW_TYPES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "bytes": pa.binary(),
    "null": pa.null(),
}


def _arrow_type(avro_type: Any) -> pa.DataType | None:
    """Arrow type of an Avro field type; None where Arrow should infer it (nested types)."""
    if isinstance(avro_type, str):
        return _PRIMITIVE_ARROW_TYPES.get(avro_type)
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) == 1:
            return _arrow_type(branches[0])
        return None
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind == "enum":
            return pa.string()
        if kind == "fixed":
            return pa.binary()
        if isinstance(kind, str) and kind in _PRIMITIVE_ARROW_TYPES:
            return _PRIMITIVE_ARROW_TYPES[kind]
    return None


def arrow_schema(avro_schema: Mapping[str, Any]) -> pa.Schema:
    """Arrow schema (one column per top-level field) of an Avro record schema, logical types read
    as their underlying type; nested fields get an inferred type (``pa.null()`` placeholder)."""
    fields = []
    for avro_field in avro_schema.get("fields", []):
        arrow_type = _arrow_type(avro_field["type"])
        fields.append(
            pa.field(avro_field["name"], arrow_type if arrow_type is not None else pa.null())
        )
    return pa.schema(fields)


def records_to_batch(records: list[Any], avro_schema: Any) -> pa.RecordBatch:
    """Decoded records (dicts) of one Avro record schema as one Arrow RecordBatch (a schema that
    is not a record gives one column ``value``)."""
    if not (isinstance(avro_schema, dict) and avro_schema.get("type") == "record"):
        return pa.RecordBatch.from_arrays([pa.array(records)], names=["value"])
    arrays = []
    names = []
    for avro_field in avro_schema.get("fields", []):
        name = avro_field["name"]
        values = list(map(operator.itemgetter(name), records)) if records else []
        arrow_type = _arrow_type(avro_field["type"])
        try:
            arrays.append(pa.array(values, type=arrow_type))
        except (pa.ArrowException, TypeError, ValueError):
            arrays.append(pa.array(values))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _open(path: str) -> BinaryIO:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_avro_batches(
    path: str, batch_records: int = DEFAULT_BATCH_RECORDS
) -> Iterator[ColumnBatch | UnreadableChunk]:
    """Stream an Avro container file as column batches of about ``batch_records`` records.

    Unreadable parts come out as :class:`UnreadableChunk` in file order: a bad header makes the
    whole file one or more ``unreadable_file`` chunks; a bad or truncated block becomes a
    ``corrupt_block`` chunk running up to the next sync marker, and reading resumes after it.
    Every byte of the file is either decoded or returned in a chunk.
    """
    if batch_records < 1:
        raise ValueError(f"batch_records must be >= 1, got {batch_records}")
    try:
        fileobj = _open(path)
    except Exception as error:  # noqa: BLE001 - any failure to open is reported, not raised
        yield UnreadableChunk(path, 0, 0, UNREADABLE_FILE, f"cannot open: {error}", b"")
        return
    with fileobj:
        yield from _read_stream(path, _ByteStream(fileobj), batch_records)


def read_avro_batches_from_bytes(
    data: bytes, source: str = "<bytes>", batch_records: int = DEFAULT_BATCH_RECORDS
) -> Iterator[ColumnBatch | UnreadableChunk]:
    """:func:`read_avro_batches` on an in-memory file (for tests and small inputs)."""
    yield from _read_stream(source, _ByteStream(io.BytesIO(data)), batch_records)


def _unreadable_file(path: str, stream: _ByteStream, detail: str) -> Iterator[UnreadableChunk]:
    """The whole file as ``unreadable_file`` chunks (header unusable: no sync marker to resync)."""
    stream.rewind(0)
    offset = 0
    while True:
        piece = stream.read_up_to(MAX_RAW_BYTES)
        if piece or offset == 0:
            yield UnreadableChunk(path, offset, len(piece), UNREADABLE_FILE, detail, piece)
        offset += len(piece)
        stream.release_before(offset)
        if len(piece) < MAX_RAW_BYTES:
            return


def _read_stream(
    path: str, stream: _ByteStream, batch_records: int
) -> Iterator[ColumnBatch | UnreadableChunk]:
    try:
        if stream.read_exact(4) != MAGIC:
            raise _Corrupt("not an Avro container file (bad magic bytes)")
        metadata: dict[str, bytes] = {}
        while True:
            count = stream.read_long()
            if count == 0:
                break
            if count < 0:
                count = -count
                stream.read_long()
            for _ in range(count):
                key = stream.read_bytes().decode("utf-8")
                metadata[key] = stream.read_bytes()
        sync = stream.read_exact(SYNC_SIZE)
        writer_schema = json.loads(metadata["avro.schema"])
        codec = metadata.get("avro.codec", b"null")
        if codec.decode() not in fastavro.read.BLOCK_READERS:
            raise _Corrupt(f"unsupported codec {codec!r}")
        fastavro.parse_schema(copy.deepcopy(writer_schema))
    except Exception as error:  # noqa: BLE001 - any header problem makes the file unreadable
        yield from _unreadable_file(path, stream, f"unreadable header: {error}")
        return

    stripped = _strip_logical_types(writer_schema)
    header = _header_bytes(stripped, codec, sync)
    decoder = _BlockDecoder(path, header, stripped, codec.decode(), sync)
    pending: list[tuple[int, int, bytes]] = []  # (offset, declared records, block data)
    pending_records = 0
    next_record = 0

    while not stream.at_end():
        block_start = stream.position
        stream.release_before(block_start)
        try:
            count = stream.read_long()
            size = stream.read_long()
            if count < 0 or size < 0 or size > MAX_BLOCK_BYTES:
                raise _Corrupt(f"invalid block header: count={count}, size={size}")
            data = stream.read_exact(size)
            if stream.read_exact(SYNC_SIZE) != sync:
                raise _Corrupt("sync marker missing after block")
        except _Corrupt as error:
            if pending:
                for item in decoder.decode(pending, next_record):
                    if isinstance(item, ColumnBatch):
                        next_record += item.rows
                    yield item
                pending, pending_records = [], 0
            for offset, piece in stream.scan_for(sync, block_start):
                yield UnreadableChunk(
                    path, offset, len(piece), CORRUPT_BLOCK, f"unreadable block: {error}", piece
                )
            continue
        pending.append((block_start, count, data))
        pending_records += count
        if pending_records >= batch_records:
            for item in decoder.decode(pending, next_record):
                if isinstance(item, ColumnBatch):
                    next_record += item.rows
                yield item
            pending, pending_records = [], 0
    if pending:
        yield from decoder.decode(pending, next_record)


class _BlockDecoder:
    """Decodes groups of blocks: vectorized (:func:`decode_flat_blocks`) when the schema is a
    flat record and the codec is null or deflate, else (or when that cannot vouch for a group)
    with fastavro, isolating the blocks that fail."""

    def __init__(self, path: str, header: bytes, schema: Any, codec: str, sync: bytes) -> None:
        self._path = path
        self._header = header
        self._schema = schema
        self._codec = codec
        self._sync = sync
        self._layout = flat_layout(schema) if codec in _FAST_CODECS else None

    def _decode(self, framed: bytes) -> list[dict[str, Any]]:
        return list(fastavro.reader(io.BytesIO(self._header + framed)))

    def _framed(self, count: int, data: bytes) -> bytes:
        return _encode_long(count) + _encode_long(len(data)) + data + self._sync

    def _decode_fast(self, blocks: list[tuple[int, int, bytes]]) -> pa.RecordBatch | None:
        if self._layout is None:
            return None
        try:
            contents = [_decompress(self._codec, data) for _, _, data in blocks]
            return decode_flat_blocks(self._layout, contents, [count for _, count, _ in blocks])
        except Exception:  # noqa: BLE001 - whatever the bytes, fastavro decides what is corrupt
            return None

    def decode(
        self, blocks: list[tuple[int, int, bytes]], first_record: int
    ) -> Iterator[ColumnBatch | UnreadableChunk]:
        fast = self._decode_fast(blocks)
        if fast is not None:
            yield ColumnBatch(self._path, first_record, fast)
            return
        try:
            records = self._decode(b"".join(self._framed(c, data) for _, c, data in blocks))
        except Exception:  # noqa: BLE001 - some block is bad: decode one by one below
            records = None
        if records is not None:
            yield ColumnBatch(self._path, first_record, records_to_batch(records, self._schema))
            return
        good: list[dict[str, Any]] = []
        for offset, count, data in blocks:
            framed = self._framed(count, data)
            try:
                good.extend(self._decode(framed))
            except Exception as error:  # noqa: BLE001
                if good:
                    yield ColumnBatch(
                        self._path, first_record, records_to_batch(good, self._schema)
                    )
                    first_record += len(good)
                    good = []
                yield UnreadableChunk(
                    self._path,
                    offset,
                    len(framed),
                    CORRUPT_BLOCK,
                    f"block of {count} records does not decode: {error}",
                    framed,
                    declared_records=count,
                )
        if good:
            yield ColumnBatch(self._path, first_record, records_to_batch(good, self._schema))


def _decompress(codec: str, data: bytes) -> bytes:
    return zlib.decompress(data, -15) if codec == "deflate" else data


def read_writer_schema(path: str) -> dict[str, Any]:
    """The writer schema stored in an Avro file's header."""
    with _open(path) as fileobj:
        return fastavro.reader(fileobj).writer_schema


def write_avro(
    path: str,
    schema: Mapping[str, Any],
    records: Iterable[Mapping[str, Any]],
    codec: str = "deflate",
) -> int:
    """Write ``records`` to a new Avro file at ``path`` (any Beam filesystem); returns the count.

    ``schema`` is a parsed schema (``schemas.parsed_schema(name)``). Long fields with a
    ``timestamp-millis`` logical type take ints of milliseconds.
    """
    counted = _Counter(records)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        fastavro.writer(sink, schema, counted, codec=codec)
    return counted.count


def write_avro_batches(
    path: str,
    schema: Mapping[str, Any],
    batches: Iterable[pa.RecordBatch],
    codec: str = "deflate",
) -> int:
    """Write Arrow batches (columns named as the schema's fields) to one Avro file."""
    return write_avro(path, schema, (row for batch in batches for row in batch.to_pylist()), codec)


class _Counter:
    def __init__(self, records: Iterable[Mapping[str, Any]]) -> None:
        self._records = records
        self.count = 0

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for record in self._records:
            self.count += 1
            yield record


# ---------------------------------------------------------------------------------------------
# Vectorized writing: Arrow/numpy columns -> Avro binary, no per-record Python
# ---------------------------------------------------------------------------------------------
#
# Every field of every row is encoded as a "ragged" byte segment (lengths per row + the
# concatenated bytes); the segments are interleaved row by row with one numpy scatter per field.
# Avro binary encoding (specification, "Binary Encoding"): int and long are zig-zag varints,
# string and bytes are a long length then the bytes, a union is the branch index (long) then the
# value, boolean one byte, float/double little-endian IEEE 754.

DEFAULT_BLOCK_BYTES = 1 << 20
_WRITE_CODECS = ("null", "deflate")


class _Ragged(typing.NamedTuple):
    lengths: np.ndarray  # int64, bytes of each row's segment
    data: np.ndarray  # uint8, the segments one after another


def _varint_segments(values: np.ndarray) -> _Ragged:
    """Zig-zag varint encoding of int64 values (Avro int/long)."""
    values = np.asarray(values, dtype=np.int64)
    zigzag = (values.astype(np.uint64) << np.uint64(1)) ^ (values >> 63).astype(np.uint64)
    lengths = np.ones(values.size, dtype=np.int64)
    for k in range(1, 10):
        lengths += zigzag >= np.uint64(1 << (7 * k))
    width = int(lengths.max()) if values.size else 1
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = (zigzag[:, None] >> shifts[None, :]) & np.uint64(0x7F)
    positions = np.arange(width)[None, :]
    continued = positions < (lengths[:, None] - 1)
    groups |= continued.astype(np.uint64) << np.uint64(7)
    keep = positions < lengths[:, None]
    return _Ragged(lengths, groups[keep].astype(np.uint8))


def _binary_payload_segments(array: pa.Array) -> _Ragged:
    """The raw bytes of a string/binary Arrow array (no length prefix); nulls are empty."""
    array = array.cast(pa.large_binary()) if not pa.types.is_large_binary(array.type) else array
    count = len(array)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[array.offset : array.offset + count + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    if array.null_count:
        lengths = np.where(array.is_null().to_numpy(zero_copy_only=False), 0, lengths)
        keep = np.repeat(~array.is_null().to_numpy(zero_copy_only=False), np.diff(offsets))
        return _Ragged(lengths, data[int(offsets[0]) : int(offsets[-1])][keep])
    return _Ragged(lengths, data[int(offsets[0]) : int(offsets[-1])])


def _interleave(segments: list[_Ragged], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate, row by row, the segments of every field: (bytes, row offsets)."""
    row_lengths = np.zeros(rows, dtype=np.int64)
    for segment in segments:
        row_lengths += segment.lengths
    row_offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=row_offsets[1:])
    out = np.empty(int(row_offsets[-1]), dtype=np.uint8)
    field_start = row_offsets[:-1].copy()
    for segment in segments:
        if segment.data.size:
            source_start = np.zeros(rows, dtype=np.int64)
            np.cumsum(segment.lengths[:-1], out=source_start[1:])
            shift = np.repeat(field_start - source_start, segment.lengths)
            out[np.arange(segment.data.size, dtype=np.int64) + shift] = segment.data
        field_start += segment.lengths
    return out, row_offsets


def _concat_ragged(parts: list[_Ragged], rows: int) -> _Ragged:
    data, offsets = _interleave(parts, rows)
    return _Ragged(np.diff(offsets), data)


def _value_segments(avro_type: Any, column: Any, rows: int) -> _Ragged:
    """Encoded bytes of one field for every row; ``column`` is an Arrow array, a numpy array or
    one Python value for all rows."""
    if isinstance(avro_type, dict) and avro_type.get("type") in ("int", "long", "string", "bytes"):
        avro_type = avro_type["type"]  # logical types: the underlying value is written
    if isinstance(avro_type, dict) and avro_type.get("type") == "enum":
        symbols = list(avro_type["symbols"])
        if not isinstance(column, pa.Array | pa.ChunkedArray | np.ndarray):
            return _broadcast(_varint_segments(np.array([symbols.index(column)])), rows)
        values = pa.array(column) if isinstance(column, np.ndarray) else column
        index = pc.index_in(values, value_set=pa.array(symbols))
        if index.null_count:
            raise ValueError(f"enum value not in {symbols}")
        return _varint_segments(index.to_numpy(zero_copy_only=False))
    if isinstance(avro_type, list):
        return _union_segments(avro_type, column, rows)
    if avro_type in ("int", "long"):
        if not isinstance(column, pa.Array | pa.ChunkedArray | np.ndarray):
            return _broadcast(_varint_segments(np.array([int(column)])), rows)
        values = (
            column.to_numpy(zero_copy_only=False)
            if isinstance(column, pa.Array | pa.ChunkedArray)
            else column
        )
        return _varint_segments(np.asarray(values, dtype=np.int64))
    if avro_type in ("string", "bytes"):
        if not isinstance(column, pa.Array | pa.ChunkedArray | np.ndarray):
            raw = column.encode() if isinstance(column, str) else bytes(column)
            single = _concat_ragged(
                [
                    _varint_segments(np.array([len(raw)])),
                    _Ragged(np.array([len(raw)]), np.frombuffer(raw, np.uint8)),
                ],
                1,
            )
            return _broadcast(single, rows)
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        array = pa.array(array) if isinstance(array, np.ndarray) else array
        payload = _binary_payload_segments(array)
        return _concat_ragged([_varint_segments(payload.lengths), payload], rows)
    if avro_type == "boolean":
        if not isinstance(column, pa.Array | pa.ChunkedArray | np.ndarray):
            return _broadcast(
                _Ragged(np.ones(1, np.int64), np.array([1 if column else 0], np.uint8)), rows
            )
        values = (
            column.to_numpy(zero_copy_only=False)
            if isinstance(column, pa.Array | pa.ChunkedArray)
            else column
        )
        return _Ragged(np.ones(rows, np.int64), np.asarray(values, dtype=bool).astype(np.uint8))
    if avro_type in ("float", "double"):
        dtype = "<f4" if avro_type == "float" else "<f8"
        if not isinstance(column, pa.Array | pa.ChunkedArray | np.ndarray):
            column = np.full(rows, column)
        values = (
            column.to_numpy(zero_copy_only=False)
            if isinstance(column, pa.Array | pa.ChunkedArray)
            else column
        )
        data = np.asarray(values, dtype=dtype).view(np.uint8)
        return _Ragged(np.full(rows, np.dtype(dtype).itemsize, np.int64), data.reshape(-1))
    raise ValueError(f"vectorized writing does not support Avro type {avro_type!r}")


def _broadcast(single: _Ragged, rows: int) -> _Ragged:
    return _Ragged(
        np.full(rows, int(single.lengths[0]), dtype=np.int64), np.tile(single.data, rows)
    )


def _union_segments(branches: list[Any], column: Any, rows: int) -> _Ragged:
    non_null = [branch for branch in branches if branch != "null"]
    if len(non_null) != 1 or "null" not in branches:
        raise ValueError(f"vectorized writing supports only [null, T] unions, got {branches!r}")
    null_index, value_index = branches.index("null"), branches.index(non_null[0])
    if not isinstance(column, pa.Array | pa.ChunkedArray | np.ndarray):
        if column is None:
            return _broadcast(_varint_segments(np.array([null_index])), rows)
        branch = _varint_segments(np.array([value_index]))
        return _broadcast(
            _concat_ragged([branch, _value_segments(non_null[0], column, 1)], 1), rows
        )
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    array = pa.array(array) if isinstance(array, np.ndarray) else array
    is_null = array.is_null().to_numpy(zero_copy_only=False)
    branch = _varint_segments(np.where(is_null, null_index, value_index))
    if is_null.all():
        return branch
    filled = array if not is_null.any() else array.fill_null(_fill_value(non_null[0]))
    values = _value_segments(non_null[0], filled, rows)
    if is_null.any():
        keep = np.repeat(~is_null, values.lengths)
        values = _Ragged(np.where(is_null, 0, values.lengths), values.data[keep])
    return _concat_ragged([branch, values], rows)


def _fill_value(avro_type: Any) -> Any:
    base = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    return {"string": "", "bytes": b"", "boolean": False, "float": 0.0, "double": 0.0}.get(base, 0)


def _is_column(value: Any) -> bool:
    return isinstance(value, pa.Array | pa.ChunkedArray | np.ndarray)


def _field_pieces(avro_type: Any, column: Any, rows: int) -> list[_Ragged | bytes]:
    """One field's encoding for every row as pieces written one after the other: bytes shared
    by all rows (a constant field) or ragged per-row segments."""
    if not _is_column(column):
        single = _value_segments(avro_type, column, 1)
        return [single.data.tobytes()]
    if isinstance(avro_type, dict) and avro_type.get("type") in ("string", "bytes"):
        avro_type = avro_type["type"]
    if avro_type in ("string", "bytes"):
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        array = pa.array(array) if isinstance(array, np.ndarray) else array
        payload = _binary_payload_segments(array)
        return [_varint_segments(payload.lengths), payload]
    return [_value_segments(avro_type, column, rows)]


def _ragged_array(segment: _Ragged) -> pa.Array:
    offsets = np.zeros(segment.lengths.size + 1, dtype=np.int64)
    np.cumsum(segment.lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_binary(),
        segment.lengths.size,
        [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(segment.data))],
    )


def encode_rows(
    schema: Mapping[str, Any], columns: Mapping[str, Any], rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Avro binary of ``rows`` records of a flat record schema: ``(bytes, row offsets)``.

    ``columns`` maps every field name to an Arrow array, a numpy array or a single Python value
    shared by all rows. Supported field types: null-free primitives, enums, ``[null, T]`` unions,
    logical types over int/long/string/bytes. Each field becomes ragged per-row segments (or
    bytes shared by all rows, merged with their constant neighbours); Arrow concatenates them
    row by row.
    """
    pieces: list[_Ragged | bytes] = []
    for avro_field in schema["fields"]:
        name = avro_field["name"]
        if name not in columns:
            if "default" not in avro_field:
                raise ValueError(f"no column for field {name!r}")
            value = avro_field["default"]
        else:
            value = columns[name]
        for piece in _field_pieces(avro_field["type"], value, rows):
            if isinstance(piece, bytes) and pieces and isinstance(pieces[-1], bytes):
                pieces[-1] += piece
            else:
                pieces.append(piece)
    if all(isinstance(piece, bytes) for piece in pieces):
        row = b"".join(typing.cast(list[bytes], pieces))
        data = np.frombuffer(row * rows, dtype=np.uint8)
        return data, np.arange(rows + 1, dtype=np.int64) * len(row)
    arguments = [
        pa.scalar(piece, type=pa.large_binary())
        if isinstance(piece, bytes)
        else _ragged_array(piece)
        for piece in pieces
    ]
    joined = pc.binary_join_element_wise(*arguments, pa.scalar(b"", type=pa.large_binary()))
    buffers = joined.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[joined.offset : joined.offset + rows + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    start = int(offsets[0])
    return data[start : int(offsets[-1])], offsets - start


def _schema_for_header(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _schema_for_header(v) for k, v in schema.items() if not str(k).startswith("__")}
    if isinstance(schema, list):
        return [_schema_for_header(item) for item in schema]
    return schema


def encode_container(
    schema: Mapping[str, Any],
    columns: Mapping[str, Any],
    rows: int,
    codec: str = "null",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> bytes:
    """A whole Avro container file (header, blocks of about ``block_bytes``) for ``rows`` records."""
    if codec not in _WRITE_CODECS:
        raise ValueError(f"codec must be one of {_WRITE_CODECS}, got {codec!r}")
    data, row_offsets = encode_rows(schema, columns, rows)
    sync = os.urandom(SYNC_SIZE)
    parts = [_header_bytes(_schema_for_header(schema), codec.encode(), sync)]
    begin = 0
    while begin < rows:
        end = int(np.searchsorted(row_offsets, row_offsets[begin] + block_bytes, side="right")) - 1
        end = min(max(end, begin + 1), rows)
        block = data[row_offsets[begin] : row_offsets[end]].tobytes()
        if codec == "deflate":
            compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
            block = compressor.compress(block) + compressor.flush()
        parts.append(_encode_long(end - begin) + _encode_long(len(block)) + block + sync)
        begin = end
    return b"".join(parts)


def write_avro_columns(
    path: str,
    schema: Mapping[str, Any],
    columns: Mapping[str, Any],
    rows: int,
    codec: str = "null",
) -> int:
    """Write ``rows`` records given as columns (see :func:`encode_rows`) to an Avro file at
    ``path`` on any Beam filesystem, without per-record Python; returns ``rows``."""
    content = encode_container(schema, columns, rows, codec)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        sink.write(content)
    return rows


# ---------------------------------------------------------------------------------------------
# Vectorized reading: Avro binary of flat records -> Arrow columns, no per-record Python
# ---------------------------------------------------------------------------------------------
#
# A block holds its records back to back, each field encoded as in "Binary Encoding" (see the
# writing section above), so where a record starts depends on every byte before it. Record
# starts are found in three vectorized steps:
#
# 1. a short walk from every block start (one record per step for all blocks at once) samples
#    the first bytes records begin with;
# 2. every position whose first bytes match a sampled beginning is a candidate; the position
#    after one record is computed for all candidates at once;
# 3. from each block start the chain "next record" is followed through the candidates by
#    pointer doubling (log2 of the block's record count vectorized steps).
#
# Then every field is decoded for all records at once and the result is checked exactly: each
# record must end where the next one starts and each block where its last record ends, every
# varint must fit in 10 bytes, every length and union branch must be valid, strings valid UTF-8.
# A group of blocks that fails any check (or a candidate chain that breaks) is decoded by
# fastavro instead, so the output never depends on a guess.

_FAST_CODECS = ("null", "deflate")
_FLAT_KINDS = ("int", "long", "float", "double", "string", "bytes")
_VARINT_KINDS = ("int", "long", "enum")
_FIXED_SIZES = {"float": 4, "double": 8}
_INT32_RANGE = (-(2**31), 2**31 - 1)
# Zero bytes after the data, so that short reads past its end need no bounds checks.
_PADDING = 16
# Largest group of blocks (decompressed bytes) decoded with numpy; larger ones go to fastavro.
_MAX_FAST_BYTES = 1 << 30
# Records sampled from the starts of the blocks (the first ones of every block, at most 16 per
# block), most distinct record beginnings used, and the most candidates per record before the
# sampled beginnings are judged too unselective.
_SAMPLED_RECORDS = 64
_SAMPLED_PER_BLOCK = 16
_MAX_BEGINNINGS = 16
_MAX_BEGINNING_BYTES = 4
_CANDIDATES_PER_RECORD = 1.25


@dataclass(frozen=True)
class FlatField:
    """One field of a flat record schema: its value kind (int, long, float, double, string,
    bytes, enum), its ``[null, T]`` union branches (-1 when not a union) and its Arrow type."""

    name: str
    kind: str
    value_branch: int
    null_branch: int
    symbols: tuple[str, ...]
    arrow_type: pa.DataType


def _flat_kind(avro_type: Any) -> tuple[str, tuple[str, ...]] | None:
    if isinstance(avro_type, str):
        return (avro_type, ()) if avro_type in _FLAT_KINDS else None
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind in _FLAT_KINDS:
            return kind, ()
        symbols = avro_type.get("symbols")
        if (
            kind == "enum"
            and isinstance(symbols, list)
            and all(isinstance(s, str) for s in symbols)
        ):
            return "enum", tuple(symbols)
    return None


def flat_layout(schema: Any) -> tuple[FlatField, ...] | None:
    """The fields of a record schema (logical types already stripped) whose fields are all
    int, long, float, double, string, bytes, enum or a ``[null, T]`` union of one of them;
    None for any other schema (those are read with fastavro)."""
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return None
    fields = []
    for avro_field in schema.get("fields", []):
        avro_type = avro_field["type"]
        value_branch = null_branch = -1
        if isinstance(avro_type, list):
            if len(avro_type) != 2 or avro_type.count("null") != 1:
                return None
            null_branch = avro_type.index("null")
            value_branch = 1 - null_branch
            avro_type = avro_type[value_branch]
        found = _flat_kind(avro_type)
        arrow_type = _arrow_type(avro_field["type"])
        if found is None or arrow_type is None:
            return None
        kind, symbols = found
        fields.append(
            FlatField(avro_field["name"], kind, value_branch, null_branch, symbols, arrow_type)
        )
    return tuple(fields) or None


def _varints(buf: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Zig-zag varints starting at positions ``q``: (uint64 zig-zag values, end positions,
    whether all of them end within 10 bytes)."""
    first = buf.take(q, mode="clip")
    zigzag = (first & 0x7F).astype(np.uint64)
    more = first >= 0x80
    end = q + 1
    for index in range(1, 10):
        if not more.any():
            return zigzag, end, True
        end += more
        group = buf.take(q + index, mode="clip")
        shifted = (group & 0x7F).astype(np.uint64) << np.uint64(7 * index)
        shifted[~more] = 0
        zigzag |= shifted
        more &= group >= 0x80
    return zigzag, end, not more.any()


def _signed(zigzag: np.ndarray) -> np.ndarray:
    return (zigzag >> np.uint64(1)).astype(np.int64) ^ -(zigzag & np.uint64(1)).astype(np.int64)


def _varint_ends(buf: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Position after the varint starting at each of ``q`` (at most 10 bytes read)."""
    more = buf.take(q, mode="clip") >= 0x80
    end = q + 1
    for index in range(1, 10):
        if not more.any():
            break
        end += more
        more &= buf.take(q + index, mode="clip") >= 0x80
    return end


def _skip_value(kind: str, buf: np.ndarray, q: np.ndarray, limit: int) -> np.ndarray:
    """Position after a value of ``kind`` starting at ``q`` (garbage in, bounded garbage out)."""
    if kind in _VARINT_KINDS:
        return _varint_ends(buf, q)
    if kind in ("string", "bytes"):
        first = buf.take(q, mode="clip")
        zigzag = first.astype(np.int64)
        end = q + 1
        long_prefix = np.flatnonzero(first >= 0x80)
        if long_prefix.size:
            values, ends, _ = _varints(buf, q[long_prefix])
            zigzag[long_prefix] = np.minimum(values, np.uint64(2 * limit)).astype(np.int64)
            end[long_prefix] = ends
        # A negative length (odd zig-zag) cannot be a real record: send it past the data.
        return np.where(zigzag & 1, limit + 1, end + (zigzag >> 1))
    return q + _FIXED_SIZES[kind]


def _skip_record(fields: tuple[FlatField, ...], buf: np.ndarray, q: np.ndarray, limit: int):
    """Position after one record for records starting at ``q`` (int64, at most ``limit + 1``)."""
    q = q.astype(np.int64)
    for field in fields:
        if field.value_branch >= 0:
            branch = buf.take(q, mode="clip")
            after_branch = q + 1
            value_end = _skip_value(field.kind, buf, after_branch, limit)
            q = np.where(branch == 2 * field.value_branch, value_end, after_branch)
        else:
            q = _skip_value(field.kind, buf, q, limit)
        np.minimum(q, limit + 1, out=q)
    return q


def _sample_beginnings(
    fields: tuple[FlatField, ...], buf: np.ndarray, size: int, block_starts: np.ndarray, counts
) -> np.ndarray:
    """Starts of the first records of every block (a walk; unchecked, used only as guesses)."""
    q = block_starts.astype(np.int64)
    per_block = min(_SAMPLED_PER_BLOCK, -(-_SAMPLED_RECORDS // q.size))
    remaining = np.minimum(counts, per_block)
    found = []
    while q.size:
        keep = remaining > 0
        q, remaining = q[keep], remaining[keep]
        found.append(q)
        q = _skip_record(fields, buf, q, size)
        remaining = remaining - 1
    sample = np.concatenate(found)
    return sample[sample < size]


def _candidates(buf: np.ndarray, size: int, sample: np.ndarray, records: int) -> np.ndarray:
    """Positions whose first bytes equal the first bytes of some sampled record: the shortest
    beginning (1 to 4 bytes) that leaves few candidates per record, or the most selective."""
    firsts = np.unique(buf[sample])
    if firsts.size > _MAX_BEGINNINGS:
        return sample
    data = buf[:size]
    mask = data == firsts[0]
    for value in firsts[1:]:
        mask |= data == value
    candidates = np.flatnonzero(mask)
    if candidates.size <= _CANDIDATES_PER_RECORD * records:
        return candidates

    def beginnings(positions: np.ndarray) -> np.ndarray:
        code = buf.take(positions).astype(np.uint32)
        for offset in range(1, _MAX_BEGINNING_BYTES):
            code |= buf.take(positions + offset).astype(np.uint32) << np.uint32(8 * offset)
        return code

    candidate_codes = beginnings(candidates)
    sample_codes = beginnings(sample)
    for length in range(2, _MAX_BEGINNING_BYTES + 1):
        keep_bytes = np.uint32((1 << (8 * length)) - 1)
        known = np.unique(sample_codes & keep_bytes)
        if known.size > _MAX_BEGINNINGS:
            break
        masked = candidate_codes & keep_bytes
        keep = known[np.minimum(known.searchsorted(masked), known.size - 1)] == masked
        candidates, candidate_codes = candidates[keep], candidate_codes[keep]
        if candidates.size <= _CANDIDATES_PER_RECORD * records:
            break
    return candidates


def _record_starts(
    fields: tuple[FlatField, ...],
    buf: np.ndarray,
    size: int,
    block_starts: np.ndarray,
    counts: np.ndarray,
) -> np.ndarray | None:
    """Start of every record (blocks with records only), or None where the candidates do not
    hold a chain of ``count`` records from some block's start."""
    records = int(counts.sum())
    sample = np.unique(_sample_beginnings(fields, buf, size, block_starts, counts))
    candidates = _candidates(buf, size, sample, records)
    found = np.minimum(candidates.searchsorted(sample), candidates.size - 1)
    missing = sample[candidates[found] != sample] if candidates.size else sample
    if missing.size:
        candidates = np.sort(np.concatenate((candidates, missing)))
    following = _skip_record(fields, buf, candidates, size)
    index = np.minimum(candidates.searchsorted(following), candidates.size - 1)
    missing = candidates.size  # the chain leaves the candidates: a node that maps to itself
    jump = np.append(np.where(candidates[index] == following, index, missing), missing)
    node = np.repeat(candidates.searchsorted(block_starts), counts)
    rank = np.arange(records) - np.repeat(np.cumsum(counts) - counts, counts)
    step = 1
    longest = int(counts.max())
    while step < longest:
        move = np.flatnonzero(rank & step)
        node[move] = jump[node[move]]
        step <<= 1
        if step < longest:
            jump = jump[jump]
    if np.any(node == missing):
        return None
    return candidates[node]


def _gather(buf: np.ndarray, begin: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, Any]:
    """Arrow offsets (int32) and the concatenated bytes ``buf[begin[i]:begin[i]+lengths[i]]``."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return offsets.astype(np.int32), pa.py_buffer(b"")
    index = np.repeat(begin - offsets[:-1], lengths)
    index += np.arange(total, dtype=np.int64)
    return offsets.astype(np.int32), pa.py_buffer(buf.take(index))


def _fill(values: np.ndarray, present: np.ndarray | None) -> np.ndarray:
    if present is None:
        return values
    full = np.zeros(present.size, dtype=values.dtype)
    full[present] = values
    return full


def _decode_column(
    field: FlatField, buf: np.ndarray, q: np.ndarray, limit: np.ndarray
) -> tuple[pa.Array, np.ndarray] | None:
    """(Arrow array, end positions) of ``field`` for records where it starts at ``q``; None if
    some value is not valid Avro, passes ``limit`` (its block's end) or does not fit the
    Arrow type the fastavro path would give."""
    rows = q.size
    present = None
    if field.value_branch >= 0:
        zigzag, q, complete = _varints(buf, q)
        branch = _signed(zigzag)
        present = branch == field.value_branch
        if not complete or not np.all(present | (branch == field.null_branch)):
            return None
        if present.all():
            present = None
    sub_q = q if present is None else q[present]
    sub_limit = limit if present is None else limit[present]
    validity = None if present is None else pa.py_buffer(np.packbits(present, bitorder="little"))
    nulls = 0 if present is None else rows - int(np.count_nonzero(present))
    if field.kind in ("string", "bytes"):
        zigzag, begin, complete = _varints(buf, sub_q)
        lengths = _signed(zigzag)
        sub_end = begin + lengths
        if not complete or (lengths.size and (lengths.min() < 0 or np.any(sub_end > sub_limit))):
            return None
        if int(lengths.sum()) >= 2**31:  # Arrow string/binary offsets are int32
            return None
        offsets, data = _gather(buf, _fill(begin, present), _fill(lengths, present))
        array = pa.Array.from_buffers(
            field.arrow_type, rows, [validity, pa.py_buffer(offsets), data], null_count=nulls
        )
        if field.kind == "string":
            try:
                array.validate(full=True)  # UTF-8, as fastavro checks it
            except pa.ArrowInvalid:
                return None
    elif field.kind in _VARINT_KINDS:
        zigzag, sub_end, complete = _varints(buf, sub_q)
        values = _signed(zigzag)
        if not complete:
            return None
        if values.size:
            low, high = int(values.min()), int(values.max())
            if field.kind == "int" and (low < _INT32_RANGE[0] or high > _INT32_RANGE[1]):
                return None
            if field.kind == "enum" and (low < 0 or high >= len(field.symbols)):
                return None
        if field.kind == "enum":
            indices = pa.array(_fill(values, present), mask=_mask(present), type=pa.int64())
            array = pa.array(field.symbols, type=pa.string()).take(indices)
        else:
            array = pa.array(_fill(values, present), type=field.arrow_type, mask=_mask(present))
    else:
        width = _FIXED_SIZES[field.kind]
        sub_end = sub_q + width
        if np.any(sub_end > sub_limit):
            return None
        raw = buf.take(sub_q[:, None] + np.arange(width))
        values = raw.view("<f4" if field.kind == "float" else "<f8").reshape(-1)
        array = pa.array(_fill(values, present), type=field.arrow_type, mask=_mask(present))
    if present is None:
        return array, sub_end
    end = q.copy()
    end[present] = sub_end
    return array, end


def _mask(present: np.ndarray | None) -> np.ndarray | None:
    return None if present is None else ~present


def decode_flat_blocks(
    fields: tuple[FlatField, ...], contents: list[bytes], counts: list[int]
) -> pa.RecordBatch | None:
    """Decoded Avro blocks (``contents[i]`` holds ``counts[i]`` records of a flat record
    schema, see :func:`flat_layout`) as one Arrow RecordBatch, the same as fastavro's records
    through :func:`records_to_batch`; None when the bytes are not exactly that many valid
    records (the caller then decodes with fastavro, which finds the bad block)."""
    sizes = np.array([len(content) for content in contents], dtype=np.int64)
    count_array = np.asarray(counts, dtype=np.int64)
    records = int(count_array.sum())
    size = int(sizes.sum())
    if records == 0 or size + _PADDING >= _MAX_FAST_BYTES or np.any(count_array < 0):
        return None
    # Every record takes at least one byte per field: a count beyond that is not real (and
    # must not size any array).
    if np.any((count_array == 0) != (sizes == 0)) or np.any(count_array * len(fields) > sizes):
        return None
    buf = np.frombuffer(b"".join(contents) + bytes(_PADDING), dtype=np.uint8)
    block_ends = np.cumsum(sizes)
    nonempty = count_array > 0
    block_starts = (block_ends - sizes)[nonempty]
    block_ends = block_ends[nonempty]
    count_array = count_array[nonempty]
    starts = _record_starts(fields, buf, size, block_starts, count_array)
    if starts is None:
        return None
    limit = np.repeat(block_ends, count_array)
    q = starts
    columns = []
    for field in fields:
        decoded = _decode_column(field, buf, q, limit)
        if decoded is None:
            return None
        column, q = decoded
        columns.append(column)
    # Each record ends where the next one starts, the last one of each block at the block's end.
    following = np.empty(records, dtype=np.int64)
    following[:-1] = starts[1:]
    following[np.cumsum(count_array) - 1] = block_ends
    if not np.array_equal(q, following):
        return None
    return pa.RecordBatch.from_arrays(columns, names=[field.name for field in fields])
