"""Arrow/numpy columns -> Avro binary records, without per-record Python.

Avro 1.11 specification, "Binary Encoding": int and long are zig-zag varints, string and bytes
a long length then the bytes, a union the branch index (long) then the value, boolean one byte,
float/double little-endian IEEE 754. Every field of every row is encoded as a "ragged" byte
segment (lengths per row + the concatenated bytes); Arrow then joins the segments row by row.
The container framing of the records is :mod:`schemas.avro.container`.

Where the compiled module ``esa_avro_blocks`` (``schemas/avro_blocks``) is installed, records
whose column fields are all int, long, string or bytes without nulls (logical types over them
too; constant fields of any type) are written by its ``encode_rows`` in one pass over the rows
instead: the same bytes (the tests hold both paths to fastavro), about a tenth of the time.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.avro import varint
from schemas.avro.columns import binary_buffers, packed_binary

try:  # the compiled writer of flat records (schemas/avro_blocks); numpy without it
    from esa_avro_blocks import encode_rows as _native_encode_rows
except ImportError:  # pragma: no cover - an installation from setup.py alone
    _native_encode_rows = None

__all__ = ["encode_rows"]


class _Ragged(typing.NamedTuple):
    lengths: np.ndarray  # int64, bytes of each row's segment
    data: np.ndarray  # uint8, the segments one after another


def _varint_segments(values: np.ndarray) -> _Ragged:
    """Zig-zag varint encoding of int64 values (Avro int/long)."""
    lengths, data = varint.varint_segments(np.asarray(values, dtype=np.int64))
    return _Ragged(lengths, data)


def _binary_payload_segments(array: pa.Array) -> _Ragged:
    """The raw bytes of a string/binary Arrow array (no length prefix); nulls are empty."""
    array = array.cast(pa.large_binary()) if not pa.types.is_large_binary(array.type) else array
    offsets, data = binary_buffers(array)
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


def _written_type(avro_type: Any) -> Any:
    """The type whose values are written: a logical type's underlying int, long, string or
    bytes, else ``avro_type`` itself."""
    if isinstance(avro_type, dict) and avro_type.get("type") in ("int", "long", "string", "bytes"):
        return avro_type["type"]
    return avro_type


def _binary_array(column: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Array:
    """A string or bytes column as one Arrow array."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return pa.array(array) if isinstance(array, np.ndarray) else array


def _value_segments(avro_type: Any, column: Any, rows: int) -> _Ragged:
    """Encoded bytes of one field for every row; ``column`` is an Arrow array, a numpy array or
    one Python value for all rows."""
    avro_type = _written_type(avro_type)
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
        payload = _binary_payload_segments(_binary_array(column))
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
    if _written_type(avro_type) in ("string", "bytes"):
        payload = _binary_payload_segments(_binary_array(column))
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


def _binary_piece(array: pa.Array, kind: int, index: bytes | None = None) -> tuple | None:
    """A binary or string Arrow array without nulls as an ``esa_avro_blocks.encode_rows`` piece
    of ``kind`` (``index``: a pick's entry per row); None with nulls."""
    if array.null_count:
        return None
    return (kind, *packed_binary(*binary_buffers(array)), index)


def _native_pieces(
    schema: Mapping[str, Any],
    columns: Mapping[str, Any],
    rows: int,
    prefix: pa.Array | None,
    prefix_index: np.ndarray | None,
) -> list[tuple] | None:
    """The fields of :func:`encode_rows` as pieces of ``esa_avro_blocks.encode_rows``, or None
    where a column is not an int, long, string or bytes without nulls."""
    pieces: list[tuple] = []
    if prefix is not None:
        index = None if prefix_index is None else np.asarray(prefix_index, "<i8").tobytes()
        piece = _binary_piece(prefix, 3, index)
        if piece is None:
            return None
        pieces.append(piece)
    for avro_field in schema["fields"]:
        name = avro_field["name"]
        if name not in columns and "default" not in avro_field:
            return None  # the slow path names the missing column
        value = columns[name] if name in columns else avro_field["default"]
        avro_type = _written_type(avro_field["type"])
        if not _is_column(value):
            constant = _value_segments(avro_field["type"], value, 1).data.tobytes()
            pieces.append((0, constant, None, None))
        elif avro_type in ("int", "long"):
            if isinstance(value, pa.Array | pa.ChunkedArray):
                if value.null_count:
                    return None
                value = value.to_numpy(zero_copy_only=False)
            pieces.append((1, np.asarray(value, dtype="<i8").tobytes(), None, None))
        elif avro_type in ("string", "bytes"):
            piece = _binary_piece(_binary_array(value), 2)
            if piece is None:
                return None
            pieces.append(piece)
        else:
            return None
    return pieces


def encode_rows(
    schema: Mapping[str, Any],
    columns: Mapping[str, Any],
    rows: int,
    prefix: pa.Array | None = None,
    prefix_index: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Avro binary of ``rows`` records of a flat record schema: ``(bytes, row offsets)``.

    ``columns`` maps every field name to an Arrow array, a numpy array or a single Python value
    shared by all rows. Supported field types: null-free primitives, enums, ``[null, T]`` unions,
    logical types over int/long/string/bytes. Each field becomes ragged per-row segments (or
    bytes shared by all rows, merged with their constant neighbours); Arrow concatenates them
    row by row. ``prefix`` (binary, no nulls): bytes each row starts with, the encoding of
    fields that come before ``schema``'s (an Avro record is its fields' encodings back to back),
    joined in the same pass: one value per row, or with ``prefix_index`` value
    ``prefix_index[row]`` (a few encodings many rows share, each stored once).
    """
    if _native_encode_rows is not None and rows > 0:
        native = _native_pieces(schema, columns, rows, prefix, prefix_index)
        encoded = None if native is None else _native_encode_rows(rows, native)
        if encoded is not None:
            data, row_offsets = encoded
            return np.frombuffer(data, dtype=np.uint8), np.frombuffer(row_offsets, dtype="<i8")
    if prefix is not None and prefix_index is not None:
        prefix = prefix.take(pa.array(np.asarray(prefix_index, dtype=np.int64)))
    if prefix is not None and not pa.types.is_large_binary(prefix.type):
        prefix = prefix.cast(pa.large_binary())
    pieces: list[_Ragged | bytes | pa.Array] = [] if prefix is None else [prefix]
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
        else piece
        if isinstance(piece, pa.Array)
        else _ragged_array(piece)
        for piece in pieces
    ]
    joined = pc.binary_join_element_wise(*arguments, pa.scalar(b"", type=pa.large_binary()))
    offsets, data = binary_buffers(joined)
    start = int(offsets[0])
    return data[start : int(offsets[-1])], offsets - start
