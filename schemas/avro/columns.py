"""Arrow columns for Avro values: the Arrow type of an Avro type, decoded records as one Arrow
RecordBatch, and the raw buffers of Arrow binary arrays.

Logical types are read as their underlying values (``timestamp-millis`` stays an int of ms): the
shuffler and analyzer compute with numbers, and converting every value to ``datetime`` costs
more than decoding it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "binary_buffers",
    "packed_binary",
    "arrow_type",
    "arrow_schema",
    "records_to_batch",
    "ColumnError",
]

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


class ColumnError(ValueError):
    """Decoded values of one field do not form one Arrow column (e.g. a union of string and
    long holding both)."""


def binary_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64, data bytes) of a binary or string Arrow array (no copy of the data)."""
    if pa.types.is_string(array.type):
        array = array.cast(pa.binary())
    elif pa.types.is_large_string(array.type):
        array = array.cast(pa.large_binary())
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[
        array.offset : array.offset + len(array) + 1
    ]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(1, np.uint8)
    )
    return offsets.astype(np.int64), data


def packed_binary(offsets: np.ndarray, data: np.ndarray) -> tuple[bytes, bytes]:
    """Strings given by int64 ``offsets`` into ``data`` (:func:`binary_buffers`) as the two
    buffers the compiled helpers of ``esa_avro_blocks`` take: their bytes from the first
    string's first byte, and their offsets from 0 as little-endian int64 values."""
    first = int(offsets[0])
    return (
        np.asarray(data[first : int(offsets[-1])], dtype=np.uint8).tobytes(),
        np.ascontiguousarray(offsets - first, dtype="<i8").tobytes(),
    )


def arrow_type(avro_type: Any) -> pa.DataType | None:
    """Arrow type of an Avro field type; None where Arrow should infer it (nested types)."""
    if isinstance(avro_type, str):
        return _PRIMITIVE_ARROW_TYPES.get(avro_type)
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) == 1:
            return arrow_type(branches[0])
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
        found = arrow_type(avro_field["type"])
        fields.append(pa.field(avro_field["name"], found if found is not None else pa.null()))
    return pa.schema(fields)


def records_to_batch(records: list[Any], avro_schema: Any) -> pa.RecordBatch:
    """Decoded records (dicts) of one Avro record schema as one Arrow RecordBatch (a schema that
    is not a record gives one column ``value``). Raises :class:`ColumnError` when the values of
    a field cannot form one Arrow column."""
    if not (isinstance(avro_schema, dict) and avro_schema.get("type") == "record"):
        try:
            return pa.RecordBatch.from_arrays([pa.array(records)], names=["value"])
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
            raise ColumnError(f"values do not form one column: {error}") from None
    arrays = []
    names = []
    for avro_field in avro_schema.get("fields", []):
        name = avro_field["name"]
        values = list(map(operator.itemgetter(name), records)) if records else []
        found = arrow_type(avro_field["type"])
        try:
            arrays.append(pa.array(values, type=found))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            try:
                arrays.append(pa.array(values))
            except (pa.ArrowException, TypeError, ValueError, OverflowError, RecursionError):
                raise ColumnError(
                    f"field {name!r} of type {avro_field['type']!r}: its values do not form "
                    "one column"
                ) from None
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)
