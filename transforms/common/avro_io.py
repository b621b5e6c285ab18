"""Avro files on any Beam filesystem: the codec (:mod:`schemas.avro`) applied to paths.

Paths may be local or on any filesystem Beam knows (``FileSystems``); a file is streamed, never
held whole in memory. Reading yields :class:`~schemas.avro.reader.ColumnBatch` and
:class:`~schemas.avro.reader.UnreadableChunk` items (see :mod:`schemas.avro.reader`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, BinaryIO

import fastavro
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas import progress_counts
from schemas.avro.container import encode_container
from schemas.avro.reader import (
    DEFAULT_BATCH_RECORDS,
    UNREADABLE_FILE,
    ColumnBatch,
    UnreadableChunk,
    read_container,
)
from schemas.avro.reader import block_windows as reader_windows
from schemas.regular_files import open_regular

__all__ = [
    "DEFAULT_BATCH_RECORDS",
    "ColumnBatch",
    "block_windows",
    "open_input",
    "UnreadableChunk",
    "read_avro_batches",
    "read_counted_batches",
    "records_in",
    "read_writer_schema",
    "write_avro",
    "write_avro_columns",
]


def open_input(path: str) -> BinaryIO:
    """``path`` opened for reading: a local path only if it is a regular file
    (``schemas.regular_files``: a FIFO would block forever), any other Beam filesystem's as
    ``FileSystems.open`` does."""
    if FileSystems.get_scheme(path) is None:
        return open_regular(path, "rb")
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


_open = open_input


def read_avro_batches(
    path: str,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    expect: Mapping[str, Any] | None = None,
    window: tuple[int, int, int] | None = None,
) -> Iterator[ColumnBatch | UnreadableChunk]:
    """Stream the Avro container file at ``path`` as column batches and unreadable chunks
    (:func:`schemas.avro.reader.read_container`; ``window``: only those blocks, one of
    :func:`block_windows`); a file that cannot be opened is one ``unreadable_file`` chunk of
    unknown records."""
    if batch_records < 1:
        raise ValueError(f"batch_records must be >= 1, got {batch_records}")
    try:
        fileobj = _open(path)
    except Exception as error:  # noqa: BLE001 - any failure to open is reported, not raised
        yield UnreadableChunk(path, 0, 0, UNREADABLE_FILE, f"cannot open: {error}", b"", None)
        return
    with fileobj:
        yield from read_container(fileobj, path, batch_records, expect, window=window)


def block_windows(
    path: str, max_records: int, expect: Mapping[str, Any] | None = None
) -> list[tuple[int, int, int, int]] | None:
    """``(start, stop, first record, records)`` windows of whole blocks of the file at ``path``
    (:func:`schemas.avro.reader.block_windows`: block headers read, block data seeked over);
    None when it must be read from start to end (or cannot be opened)."""
    try:
        fileobj = _open(path)
    except Exception:  # noqa: BLE001 - the whole-file reader reports it
        return None
    with fileobj:
        return reader_windows(fileobj, max_records, expect)


def records_in(item: ColumnBatch | UnreadableChunk) -> int:
    """The records a batch holds, or an unreadable chunk (0 when nobody knows how many)."""
    return item.rows if isinstance(item, ColumnBatch) else item.records or 0


def read_counted_batches(
    path: str,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    expect: Mapping[str, Any] | None = None,
    window: tuple[int, int, int] | None = None,
) -> Iterator[ColumnBatch | UnreadableChunk]:
    """:func:`read_avro_batches`, each batch's records counted as done for the progress line
    (``schemas/progress_counts.py``: one addition per batch, a write at the end of the file or
    ``window``)."""
    batches = read_avro_batches(path, batch_records, expect, window)
    return progress_counts.counted(batches, records_in)


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
    """Write ``records`` (dicts, for small outputs: dead letters, manifests) to a new Avro file at
    ``path``; returns the count. ``schema`` is a parsed schema (``schemas.parsed_schema(name)``);
    ``timestamp-millis`` fields take ints of milliseconds."""
    counted = _Counter(records)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        fastavro.writer(sink, schema, counted, codec=codec)
    return counted.count


class _Counter:
    def __init__(self, records: Iterable[Mapping[str, Any]]) -> None:
        self._records = records
        self.count = 0

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for record in self._records:
            self.count += 1
            yield record


def write_avro_columns(
    path: str,
    schema: Mapping[str, Any],
    columns: Mapping[str, Any],
    rows: int,
    codec: str = "null",
) -> int:
    """Write ``rows`` records given as columns (:func:`schemas.avro.encode.encode_rows`) to an
    Avro file at ``path``, without per-record Python; returns ``rows``."""
    content = encode_container(schema, columns, rows, codec)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        sink.write(content)
    return rows
