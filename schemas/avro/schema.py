"""Writer schemas as the reader meets them: logical types stripped, resolution against the
schema a caller expects, the smallest encoded record.

A file can carry any writer schema. :func:`resolution_problem` decides, before any record is
decoded, whether a writer schema gives what a reader schema needs (Avro 1.11 specification,
"Schema Resolution", restricted to what our columns hold): every reader field present in the
writer (or defaulted), its type the same or promoted (int -> long, float -> double), a writer
union only where every branch resolves, no logical type that changes the meaning of a value
(``timestamp-micros`` where ``timestamp-millis`` is expected). Extra writer fields are ignored.
:func:`project` then gives decoded columns the reader's names, order and types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from schemas.avro.columns import ColumnError, arrow_type

__all__ = [
    "strip_logical_types",
    "schema_for_header",
    "named_types",
    "min_record_bytes",
    "resolution_problem",
    "project",
]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_FIXED_WIDTH = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_PROMOTIONS = {("int", "long"), ("float", "double")}


def strip_logical_types(schema: Any) -> Any:
    """``schema`` without ``logicalType`` annotations (values read as their underlying type)."""
    if isinstance(schema, dict):
        return {
            key: strip_logical_types(value) for key, value in schema.items() if key != "logicalType"
        }
    if isinstance(schema, list):
        return [strip_logical_types(item) for item in schema]
    return schema


def schema_for_header(schema: Any) -> Any:
    """``schema`` without the ``__`` keys fastavro adds to parsed schemas."""
    if isinstance(schema, dict):
        return {k: schema_for_header(v) for k, v in schema.items() if not str(k).startswith("__")}
    if isinstance(schema, list):
        return [schema_for_header(item) for item in schema]
    return schema


def _full_name(node: Mapping[str, Any], namespace: str) -> tuple[str, str]:
    name = str(node.get("name", ""))
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    space = str(node.get("namespace", namespace) or "")
    return (f"{space}.{name}" if space else name), space


def named_types(schema: Any) -> dict[str, Any]:
    """Every named type (record, enum, fixed) of ``schema`` by full and short name."""
    table: dict[str, Any] = {}

    def walk(node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch, namespace)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            full, namespace = _full_name(node, namespace)
            if full in table:
                return
            table[full] = node
            table.setdefault(full.rsplit(".", 1)[-1], node)
        if kind in ("record", "error"):
            for field in node.get("fields", []) or []:
                if isinstance(field, dict):
                    walk(field.get("type"), namespace)
        elif kind == "array":
            walk(node.get("items"), namespace)
        elif kind == "map":
            walk(node.get("values"), namespace)
        elif isinstance(kind, dict | list):
            walk(kind, namespace)

    walk(schema, "")
    return table


def _deref(node: Any, names: Mapping[str, Any]) -> Any:
    if isinstance(node, str) and node not in _PRIMITIVES:
        return names.get(node, node)
    if isinstance(node, dict) and isinstance(node.get("type"), dict | list):
        return node["type"]
    return node


def _kind(node: Any) -> str | None:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "union"
    if isinstance(node, dict):
        kind = node.get("type")
        return kind if isinstance(kind, str) else None
    return None


def min_record_bytes(schema: Any) -> int:
    """The fewest bytes one value of ``schema`` can take (0 for null, empty records, ...): a
    block of ``size`` bytes cannot hold more than ``size / min_record_bytes`` values."""
    names = named_types(schema)

    def size(node: Any, busy: frozenset[str]) -> int:
        node = _deref(node, names)
        kind = _kind(node)
        if kind in _FIXED_WIDTH:
            return _FIXED_WIDTH[kind]
        if kind in ("int", "long", "string", "bytes", "enum", "array", "map", "union"):
            return 1
        if kind == "fixed":
            return max(int(node.get("size", 0) or 0), 0)
        if kind in ("record", "error"):
            full = str(node.get("name"))
            if full in busy:
                return 0
            return sum(
                size(field.get("type"), busy | {full})
                for field in node.get("fields", []) or []
                if isinstance(field, dict)
            )
        return 0

    return size(schema, frozenset())


def _logical(node: Any) -> str | None:
    return node.get("logicalType") if isinstance(node, dict) else None


def _type_problem(writer: Any, reader: Any, names: Mapping[str, Any]) -> str | None:
    """Why a writer type does not resolve to a (flat) reader type, or None."""
    writer = _deref(writer, names)
    reader_logical = _logical(reader)
    writer_logical = _logical(writer)
    if reader_logical and writer_logical and writer_logical != reader_logical:
        return f"logical type {writer_logical} where {reader_logical} is expected"
    reader_kind, writer_kind = _kind(reader), _kind(writer)
    if reader_kind == "union":
        if writer_kind == "union":
            for branch in writer:
                problem = _type_problem(branch, reader, names)
                if problem:
                    return problem
            return None
        if writer_kind == "null" and "null" in reader:
            return None
        problems = [_type_problem(writer, branch, names) for branch in reader if branch != "null"]
        return None if any(p is None for p in problems) else (problems[0] or "no branch matches")
    if writer_kind == "union":
        for branch in writer:
            problem = _type_problem(branch, reader, names)
            if problem:
                return f"union {_describe(writer)} has a branch that {problem}"
        return None
    if reader_kind == "enum":
        symbols = writer.get("symbols") if isinstance(writer, dict) else None
        if writer_kind != "enum" or not set(symbols or []) <= set(reader.get("symbols", [])):
            return f"is {_describe(writer)}, not enum {reader.get('symbols')}"
        return None
    if reader_kind == writer_kind or (writer_kind, reader_kind) in _PROMOTIONS:
        if reader_kind in _PRIMITIVES:
            return None
    return f"is {_describe(writer)}, not {reader_kind}"


def _describe(node: Any) -> str:
    if isinstance(node, dict):
        kind = node.get("type")
        logical = node.get("logicalType")
        label = f"{kind}" if not isinstance(kind, dict | list) else _describe(kind)
        return f"{label} ({logical})" if logical else label
    if isinstance(node, list):
        return "[" + ", ".join(_describe(branch) for branch in node) + "]"
    return str(node)


def resolution_problem(writer: Any, reader: Mapping[str, Any]) -> str | None:
    """Why records of ``writer`` cannot be read as the flat record ``reader``, or None."""
    names = named_types(writer)
    writer = _deref(writer, names)
    if _kind(writer) not in ("record", "error"):
        return f"the file holds {_describe(writer)} values, not {reader.get('name')} records"
    writer_fields = {
        field.get("name"): field
        for field in writer.get("fields", []) or []
        if isinstance(field, dict)
    }
    for field in reader["fields"]:
        found = writer_fields.get(field["name"])
        if found is None:
            for alias in field.get("aliases", []):
                found = writer_fields.get(alias)
        if found is None:
            if "default" in field:
                continue
            return f"field {field['name']!r} is missing"
        problem = _type_problem(found.get("type"), field["type"], names)
        if problem:
            return f"field {field['name']!r} {problem}"
    return None


def project(batch: pa.RecordBatch, reader: Mapping[str, Any]) -> pa.RecordBatch:
    """Columns of ``batch`` (decoded with a writer schema that resolves to ``reader``) as the
    reader's fields: its order, its types (promoted values cast), defaults for absent fields.
    Raises :class:`ColumnError` when a column does not cast."""
    arrays, names = [], []
    for field in reader["fields"]:
        name = field["name"]
        wanted = arrow_type(strip_logical_types(field["type"]))
        if name in batch.schema.names:
            column = batch.column(name)
        else:
            default = field.get("default")
            column = pa.array([default] * batch.num_rows, type=wanted)
        if wanted is not None and column.type != wanted:
            try:
                column = column.cast(wanted)
            except (pa.ArrowException, TypeError, ValueError) as error:
                raise ColumnError(f"field {name!r} does not cast to {wanted}: {error}") from None
        arrays.append(column)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)
