"""Record helpers: validate reports, build dead letters, write and read Avro container files.

Reading never raises on bad data (invariant 5 of DESIGN.md). :func:`read_avro_blocks` parses the
Avro object container format itself (Avro 1.11 specification, "Object Container Files": magic,
metadata map, 16-byte sync marker, then blocks of ``count, size, data, sync``) and yields either an
:class:`AvroBlock` of decoded records or a :class:`ReadError` with a reason code
(``unreadable_file`` when the header cannot be read, ``corrupt_block`` when one block cannot) and
the byte position. After a corrupt block the reader searches for the next sync marker and goes on,
so one bad block costs only its own records. Records are decoded with fastavro; a block is yielded
only once all its records decoded and its bytes were used exactly, so a block is all or nothing.

Codecs: fastavro writes ``null``, ``deflate``, ``bzip2`` and ``xz`` with the standard library
alone; ``snappy``, ``zstandard`` and ``lz4`` need extra packages (cramjam, backports.zstd, lz4)
that this project does not install, so :data:`DEFAULT_CODEC` is ``deflate``.
"""

from __future__ import annotations

import base64
import bz2
import copy
import datetime as dt
import io
import json
import lzma
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import fastavro
import numpy as np

from schemas import (
    REPORT,
    SHUFFLED_MESSAGE,
    SUPPORTED_SCHEMA_VERSIONS,
    crc32c,
    parsed_schema,
    schema_json,
)

__all__ = [
    "DEFAULT_CODEC",
    "READABLE_CODECS",
    "UNREADABLE_FILE",
    "CORRUPT_BLOCK",
    "writable_codecs",
    "report_problem",
    "validate_report",
    "shuffled_message_problem",
    "validate_shuffled_message",
    "dead_letter",
    "dead_letter_for_error",
    "write_avro",
    "AvroBlock",
    "ReadError",
    "read_avro_blocks",
    "read_avro_bytes",
    "records_to_columns",
]

DEFAULT_CODEC = "deflate"
READABLE_CODECS = ("null", "deflate", "bzip2", "xz")
UNREADABLE_FILE = "unreadable_file"
CORRUPT_BLOCK = "corrupt_block"

_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)
_HEADER_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "org.apache.avro.file.Header",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
            {"name": "meta", "type": {"type": "map", "values": "bytes"}},
            {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": _SYNC_SIZE}},
        ],
    }
)


def writable_codecs() -> tuple[str, ...]:
    """Codecs fastavro can write in this environment (tried on an empty file)."""
    usable = []
    schema = fastavro.parse_schema({"type": "record", "name": "Probe", "fields": []})
    for codec in ("null", "deflate", "bzip2", "xz", "snappy", "zstandard", "lz4"):
        try:
            fastavro.writer(io.BytesIO(), schema, [{}], codec=codec)
        except (ValueError, ImportError):
            continue
        usable.append(codec)
    return tuple(usable)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _type_problem(record: Mapping[str, Any], schema_name: str) -> tuple[str, str] | None:
    """Missing fields and Avro type mismatches against ``schemas/<schema_name>.avsc``."""
    for avro_field in schema_json(schema_name)["fields"]:
        name, avro_type = avro_field["name"], avro_field["type"]
        if name not in record:
            if "default" in avro_field:
                continue
            return "missing_field", f"required field {name!r} is missing"
        value = record[name]
        nullable = isinstance(avro_type, list) and "null" in avro_type
        if isinstance(avro_type, list):
            avro_type = next(t for t in avro_type if t != "null")
        if value is None:
            if nullable:
                continue
            return "wrong_type", f"field {name!r} must not be null"
        logical = avro_type.get("logicalType") if isinstance(avro_type, dict) else None
        base = avro_type["type"] if isinstance(avro_type, dict) else avro_type
        if logical == "timestamp-millis" and isinstance(value, dt.datetime):
            continue
        if base in ("int", "long"):
            if not _is_int(value):
                return "wrong_type", f"field {name!r} must be an {base}, got {type(value).__name__}"
            low, high = _INT32 if base == "int" else _INT64
            if not low <= int(value) <= high:
                return "out_of_range", f"field {name!r}={value} does not fit an Avro {base}"
        elif base == "string":
            if not isinstance(value, str):
                return "wrong_type", f"field {name!r} must be a string, got {type(value).__name__}"
        elif base == "bytes":
            if not isinstance(value, bytes | bytearray | memoryview):
                return "wrong_type", f"field {name!r} must be bytes, got {type(value).__name__}"
    return None


def _common_problem(record: Any, schema_name: str) -> tuple[str, str] | None:
    if not isinstance(record, Mapping):
        return "not_a_record", f"expected a mapping, got {type(record).__name__}"
    version = record.get("schema_version")
    if _is_int(version) and int(version) not in SUPPORTED_SCHEMA_VERSIONS:
        return (
            "unknown_schema_version",
            f"schema_version {version} not in {sorted(SUPPORTED_SCHEMA_VERSIONS)}",
        )
    problem = _type_problem(record, schema_name)
    if problem:
        return problem
    for name in ("channel", "recipe_id"):
        if not record[name]:
            return "out_of_range", f"field {name!r} must not be empty"
    if "@" not in record["recipe_id"]:
        return "out_of_range", f"recipe_id {record['recipe_id']!r} is not name@version"
    if not _UINT32[0] <= int(record["payload_crc32c"]) <= _UINT32[1]:
        return "out_of_range", "payload_crc32c must be an unsigned 32-bit value"
    return None


def _crc_problem(record: Mapping[str, Any]) -> tuple[str, str] | None:
    actual = crc32c(bytes(record["payload"]))
    if actual != int(record["payload_crc32c"]):
        return "crc_mismatch", f"payload CRC32C is {actual}, record says {record['payload_crc32c']}"
    return None


def report_problem(record: Any, check_crc: bool = True) -> tuple[str, str] | None:
    """(reason code, detail) of the first problem with a Report dict, or None if it is valid.

    Reasons: not_a_record, unknown_schema_version, missing_field, wrong_type, out_of_range,
    crc_mismatch.
    """
    problem = _common_problem(record, REPORT)
    if problem:
        return problem
    if int(record["shuffler_instance"]) < 0:
        return "out_of_range", "shuffler_instance must be >= 0"
    if int(record["min_crowd_size"]) < 1:
        return "out_of_range", "min_crowd_size must be >= 1"
    if not record["origin"]:
        return "out_of_range", "origin must not be empty"
    return _crc_problem(record) if check_crc else None


def validate_report(record: Any, check_crc: bool = True) -> str | None:
    """The reason code why a Report dict is invalid, or None."""
    problem = report_problem(record, check_crc)
    return problem[0] if problem else None


def shuffled_message_problem(record: Any, check_crc: bool = True) -> tuple[str, str] | None:
    """(reason, detail) of the first problem with a ShuffledMessage dict, or None."""
    problem = _common_problem(record, SHUFFLED_MESSAGE)
    if problem:
        return problem
    start, end = record["window_start"], record["window_end"]
    if type(start) is type(end) and not start < end:
        return "out_of_range", "window_start must be before window_end"
    return _crc_problem(record) if check_crc else None


def validate_shuffled_message(record: Any, check_crc: bool = True) -> str | None:
    """The reason code why a ShuffledMessage dict is invalid, or None."""
    problem = shuffled_message_problem(record, check_crc)
    return problem[0] if problem else None


# ---------------------------------------------------------------------------------------------
# Dead letters
# ---------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return repr(value)


def dead_letter(
    stage: str,
    reason: str,
    detail: str,
    source: str,
    original_bytes: bytes | None = None,
    original_record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A DeadLetter record (``schemas/dead_letter.avsc``); bytes in the record become base64."""
    for name, value in (("stage", stage), ("reason", reason)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"dead letter {name} must be a non-empty string, got {value!r}")
    record_json = None
    if original_record is not None:
        record_json = json.dumps(dict(original_record), default=_json_default, sort_keys=True)
    return {
        "stage": stage,
        "reason": reason,
        "detail": str(detail),
        "source": str(source),
        "original_bytes": None if original_bytes is None else bytes(original_bytes),
        "original_record": record_json,
    }


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def write_avro(
    destination: str | os.PathLike[str] | BinaryIO,
    schema_name: str,
    records: Iterable[Mapping[str, Any]],
    codec: str = DEFAULT_CODEC,
    sync_interval: int = 16000 * 4,
) -> None:
    """Write ``records`` as an Avro container file of ``schemas/<schema_name>.avsc``."""
    if codec not in writable_codecs():
        raise ValueError(f"codec {codec!r} is not available; use one of {writable_codecs()}")
    schema = parsed_schema(schema_name)
    if isinstance(destination, str | os.PathLike):
        with open(destination, "wb") as handle:
            fastavro.writer(handle, schema, records, codec=codec, sync_interval=sync_interval)
    else:
        fastavro.writer(destination, schema, records, codec=codec, sync_interval=sync_interval)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AvroBlock:
    """One container block: its byte offset and size in the file and its decoded records."""

    source: str
    offset: int
    size: int
    records: list[dict[str, Any]]


@dataclass(frozen=True)
class ReadError:
    """A part of a file that could not be read; ``records_lost`` is -1 when unknown."""

    source: str
    reason: str
    position: int
    detail: str
    records_lost: int = -1

    @property
    def location(self) -> str:
        return f"{self.source}@{self.position}"


class _Stream:
    """A binary stream that knows its position (works for unseekable streams too)."""

    def __init__(self, handle: BinaryIO, start: int = 0) -> None:
        self._handle = handle
        self.position = start

    def read(self, n: int) -> bytes:
        # In bounded pieces: a corrupt size field must not make us allocate gigabytes.
        pieces = []
        remaining = n
        while remaining > 0:
            chunk = self._handle.read(min(remaining, 1 << 20))
            if not chunk:
                break
            pieces.append(chunk)
            remaining -= len(chunk)
        data = b"".join(pieces)
        self.position += len(data)
        return data

    def read_long(self) -> int | None:
        """One zigzag varint; None at a clean end of stream; ValueError when malformed."""
        result = shift = 0
        for index in range(10):
            byte = self.read(1)
            if not byte:
                if index == 0:
                    return None
                raise ValueError("stream ends inside a varint")
            result |= (byte[0] & 0x7F) << shift
            if not byte[0] & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
        raise ValueError("varint longer than 10 bytes")

    def skip_to_sync(self, sync: bytes) -> bool:
        """Advance to just after the next ``sync``; False if the stream ends first."""
        window = b""
        while True:
            chunk = self.read(1 << 16)
            if not chunk:
                return False
            window += chunk
            found = window.find(sync)
            if found >= 0:
                surplus = len(window) - (found + len(sync))
                self._push_back(window[found + len(sync) :], surplus)
                return True
            window = window[-(len(sync) - 1) :]

    def _push_back(self, data: bytes, count: int) -> None:
        if count == 0:
            return
        if hasattr(self._handle, "seek") and self._handle.seekable():
            self._handle.seek(-count, io.SEEK_CUR)
        else:
            self._handle = _Prepended(data, self._handle)
        self.position -= count


class _Prepended(io.RawIOBase):
    def __init__(self, head: bytes, tail: BinaryIO) -> None:
        self._head, self._tail = head, tail

    def read(self, n: int = -1) -> bytes:
        if self._head:
            chunk, self._head = self._head[:n], self._head[n:]
            return chunk
        return self._tail.read(n)

    def seekable(self) -> bool:
        return False


def _strip_logical_types(schema: Any) -> Any:
    """A copy of ``schema`` with logical types removed (timestamps stay int milliseconds)."""
    if isinstance(schema, list):
        return [_strip_logical_types(s) for s in schema]
    if isinstance(schema, dict):
        if "logicalType" in schema and schema.get("type") in ("int", "long", "bytes", "string"):
            return schema["type"]
        stripped = {k: _strip_logical_types(v) for k, v in schema.items()}
        if "fields" in schema:
            stripped["fields"] = [
                {**f, "type": _strip_logical_types(f["type"])} for f in schema["fields"]
            ]
        return stripped
    return schema


def _decompress(codec: str, data: bytes) -> bytes:
    if codec == "null":
        return data
    if codec == "deflate":
        return zlib.decompress(data, -15)
    if codec == "bzip2":
        return bz2.decompress(data)
    if codec == "xz":
        return lzma.decompress(data)
    raise ValueError(f"codec {codec!r} cannot be read here; readable: {READABLE_CODECS}")


def read_avro_blocks(
    source: str | os.PathLike[str] | BinaryIO,
    logical_types: bool = False,
    name: str | None = None,
) -> Iterator[AvroBlock | ReadError]:
    """Yield every block of an Avro container file, or a :class:`ReadError` where one fails.

    ``logical_types=False`` returns timestamps as int milliseconds (the stored values), which is
    what callers building numpy arrays want; True returns ``datetime`` objects. ``name`` labels
    the source in errors (default: the path, or ``"<stream>"``).
    """
    if isinstance(source, str | os.PathLike):
        label = name or str(source)
        try:
            handle: BinaryIO = open(source, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as error:
            yield ReadError(label, UNREADABLE_FILE, 0, f"cannot open: {error}")
            return
        try:
            yield from _read_blocks(handle, label, logical_types)
        finally:
            handle.close()
    else:
        yield from _read_blocks(source, name or "<stream>", logical_types)


def _read_blocks(
    handle: BinaryIO, label: str, logical_types: bool
) -> Iterator[AvroBlock | ReadError]:
    stream = _Stream(handle)
    try:
        header = fastavro.schemaless_reader(stream, _HEADER_SCHEMA, None)
        if header["magic"] != _MAGIC:
            raise ValueError("not an Avro container file (bad magic)")
        codec = header["meta"].get("avro.codec", b"null").decode()
        if codec not in READABLE_CODECS:
            raise ValueError(f"codec {codec!r} cannot be read here; readable: {READABLE_CODECS}")
        writer_json = json.loads(header["meta"]["avro.schema"].decode())
        schema = writer_json if logical_types else _strip_logical_types(writer_json)
        parsed = fastavro.parse_schema(copy.deepcopy(schema))
        sync = header["sync"]
    except Exception as error:  # any failure to read a header makes the whole file unreadable
        yield ReadError(label, UNREADABLE_FILE, 0, f"{type(error).__name__}: {error}")
        return
    while True:
        offset = stream.position
        count: int | None = -1
        framed = False  # count, size, data and a matching sync marker were all read
        try:
            count = stream.read_long()
            if count is None:
                return
            size = stream.read_long()
            if count < 0 or size is None or size < 0:
                raise ValueError(f"bad block header: count={count}, size={size}")
            data = stream.read(size)
            if len(data) != size:
                raise ValueError(f"block truncated: {len(data)} of {size} bytes")
            if stream.read(_SYNC_SIZE) != sync:
                raise ValueError("sync marker missing after block")
            framed = True
            raw = _decompress(codec, data)
            buffer = io.BytesIO(raw)
            records = [fastavro.schemaless_reader(buffer, parsed, None) for _ in range(count)]
            if buffer.tell() != len(raw):
                raise ValueError(f"{len(raw) - buffer.tell()} bytes left after {count} records")
        except Exception as error:  # a bad block must never stop the reader
            detail = f"{type(error).__name__}: {error}"
            if framed:
                # The sync marker confirms where the block ends: exactly its records are lost.
                yield ReadError(label, CORRUPT_BLOCK, offset, detail, records_lost=count)
                continue
            # Unknown extent: resume after the next sync marker and say which bytes were skipped.
            # Seekable inputs rescan from just after the block start; an unseekable stream can
            # only scan forward from where reading stopped, which may skip more.
            restart = offset + 1
            if stream.position > restart and hasattr(handle, "seek") and handle.seekable():
                handle.seek(restart)
                stream.position = restart
            found = stream.skip_to_sync(sync)
            skipped = (
                f"bytes {offset}..{stream.position} skipped" if found else "rest of file skipped"
            )
            yield ReadError(label, CORRUPT_BLOCK, offset, f"{detail}; {skipped}")
            if not found:
                return
            continue
        yield AvroBlock(label, offset, stream.position - offset, records)


def records_to_columns(
    records: list[Mapping[str, Any]], fields: Iterable[str]
) -> dict[str, np.ndarray]:
    """Columns of ``records``: int fields as int64 arrays, everything else as object arrays."""
    columns = {}
    for name in fields:
        values = [record[name] for record in records]
        if values and all(_is_int(v) for v in values):
            columns[name] = np.asarray(values, dtype=np.int64)
        else:
            columns[name] = np.asarray(values, dtype=object)
    return columns


def dead_letter_for_error(stage: str, error: ReadError) -> dict[str, Any]:
    """The dead-letter record for a :class:`ReadError`."""
    lost = "unknown" if error.records_lost < 0 else str(error.records_lost)
    return dead_letter(
        stage,
        error.reason,
        f"{error.detail} (records lost: {lost})",
        error.location,
    )


# Bytes of a whole file are sometimes easier to pass around than paths (tests, Beam elements).
def read_avro_bytes(data: bytes, name: str = "<bytes>") -> Iterator[AvroBlock | ReadError]:
    """:func:`read_avro_blocks` over an in-memory file."""
    return read_avro_blocks(io.BytesIO(data), name=name)
