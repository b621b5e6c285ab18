"""The shuffler's spill format: rows written once as Arrow IPC record batches, read by pointer.

Only small pointers (:class:`Piece`: file, byte range, rows) travel through Beam's shuffles; the
rows themselves are spilled to files under the run's spill directory (shuffler-private, under
``--private-output``, never inside a release) and read back by the shard or group that needs
them, so no worker holds a crowd, a window or a file in memory.

What a spill file may hold (issue: releases that cannot lie): never a plaintext origin next to a
payload. Report rows carry ``origin_hash`` (the secret-keyed 64-bit hash of
``shuffle_core.origin_hashes``, computed before anything is written), event time, the device's
minimum crowd, payload and CRC, and the record's position in its input file. Released rows carry
payload and CRC only. Distinct respondents are counted as distinct hashes: two origins of one
crowd that collide count once (probability about n**2 / 2**65 for n origins, 3e-8 at a million),
which can only lower a count, never raise it. Spill directories are removed by the driver on every exit path and, for a
run killed before it could, by the next run into the same private path (:func:`remove_spill`).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import shuffle_core as core

# (window_start_ms, instance, channel, recipe, crowd)
CrowdKey = tuple[int, int, str, str, str | None]


class Piece(NamedTuple):
    """Pointer to rows spilled as one Arrow IPC record batch message: bytes
    ``offset .. offset + length - 1`` of the spill file at ``path``.

    Unpickled pieces share their path strings (:func:`_piece`): every crowd of an input batch
    points into one spill file from one input file, and a runner that holds grouped values
    decoded (FnApiRunner) would otherwise keep two path strings per crowd and batch.
    """

    path: str
    offset: int
    length: int
    rows: int
    source: str  # the input file the rows came from
    min_crowd: int  # the largest min_crowd_size among the rows

    def __reduce__(self) -> tuple:
        return (_piece, tuple(self))


def _piece(path: str, offset: int, length: int, rows: int, source: str, min_crowd: int) -> Piece:
    return Piece(sys.intern(path), offset, length, rows, sys.intern(source), min_crowd)


class ShardTask(NamedTuple):
    """One origin shard of a crowd: rows with hash top ``bits`` bits equal to ``shard``.

    ``piece_list`` points to the crowd's list of pieces (:func:`write_piece_list`), so that a
    task stays small however many input batches the crowd came from; ``min_crowd`` is the
    largest min_crowd_size in the crowd.
    """

    shard: int
    bits: int
    piece_list: Piece
    min_crowd: int


class ShardCount(NamedTuple):
    """Distinct respondents (origins, presence or data) and kept data messages of a shard."""

    task: ShardTask
    respondents: int
    messages: int


class DeletionTask(NamedTuple):
    """Delete ``respondents_deleted`` of the shard's origins; scatter the surviving messages over
    2**bucket_bits uniform buckets (merged into the crowd's output groups later)."""

    task: ShardTask
    respondents: int
    respondents_deleted: int
    bucket_bits: int


class BucketPiece(NamedTuple):
    """Surviving messages of one shard that drew one bucket."""

    bucket: int
    bucket_bits: int
    piece: Piece


# Spill files hold record batch messages of one of these schemas (no schema message: readers
# know it), one after another, so that a piece is read with one seek and one read.
REPORT_SPILL_SCHEMA = pa.schema(
    [
        ("origin_hash", pa.uint64()),
        ("event_time", pa.int64()),
        ("min_crowd_size", pa.int64()),
        ("payload", pa.binary()),
        ("payload_crc32c", pa.int64()),
        ("record_index", pa.int64()),
    ]
)
# Report columns copied into the spill as they are (origin_hash and record_index are computed).
SPILLED_REPORT_COLUMNS = ("event_time", "min_crowd_size", "payload", "payload_crc32c")
RELEASED_SPILL_SCHEMA = pa.schema([("payload", pa.binary()), ("payload_crc32c", pa.int64())])
PIECE_LIST_SCHEMA = pa.schema(
    [(name, pa.string() if name in ("path", "source") else pa.int64()) for name in Piece._fields]
)
# Column that :func:`read_shard_rows` adds: the index of the row's piece in the crowd's list.
PIECE_INDEX = "piece_index"
# A shard's rows are copied out of the pieces read for it whenever the pieces held reach this
# many bytes, so memory follows the shard's size, not its crowd's.
_COMPACT_BYTES = 16 << 20


def spill_path(spill_dir: str, kind: str) -> str:
    """A new spill file name (random: a retried bundle's files are orphans removed with the
    directory; nothing points to them)."""
    return FileSystems.join(spill_dir, kind, f"{secrets.token_hex(16)}.arrow")


def remove_spill(spill_root: str) -> bool:
    """Remove a spill directory and everything in it (stale ones of killed runs included);
    returns whether there was one."""
    if FileSystems.exists(spill_root):
        FileSystems.delete([spill_root])
        return True
    return False


def write_spill(path: str, batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    """Write record batches to a new spill file at ``path`` as consecutive Arrow IPC record
    batch messages; returns each one's ``(offset, length)`` in the file."""
    positions = []
    offset = 0
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for batch in batches:
            message = batch.serialize()
            handle.write(memoryview(message))
            positions.append((offset, message.size))
            offset += message.size
    return positions


def read_spill(piece: Piece, schema: pa.Schema) -> pa.RecordBatch:
    """The record batch a piece points to (one seek and one read of its bytes)."""
    if FileSystems.get_scheme(piece.path) is None:
        with open(piece.path, "rb", buffering=0) as handle:
            handle.seek(piece.offset)
            data = handle.read(piece.length)
    else:
        with FileSystems.open(piece.path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(piece.offset)
            data = handle.read(piece.length)
    if len(data) != piece.length:
        raise RuntimeError(f"spill file {piece.path} is shorter than expected")
    return pa.ipc.read_record_batch(pa.py_buffer(data), schema)


def write_piece_list(spill_dir: str, pieces: tuple[Piece, ...]) -> Piece:
    """Spill a crowd's pieces (one row each); returns the pointer to the list."""
    columns = [
        pa.array([getattr(piece, name) for piece in pieces], type=field.type)
        for name, field in zip(Piece._fields, PIECE_LIST_SCHEMA, strict=True)
    ]
    path = spill_path(spill_dir, "crowds")
    ((offset, length),) = write_spill(
        path, [pa.RecordBatch.from_arrays(columns, schema=PIECE_LIST_SCHEMA)]
    )
    return Piece(
        path, offset, length, len(pieces), "", max((p.min_crowd for p in pieces), default=0)
    )


def read_piece_list(piece_list: Piece) -> list[Piece]:
    """The pieces :func:`write_piece_list` spilled."""
    batch = read_spill(piece_list, PIECE_LIST_SCHEMA)
    columns = [batch.column(name).to_pylist() for name in Piece._fields]
    return [Piece(*values) for values in zip(*columns, strict=True)]


def read_shard_rows(task: ShardTask, columns: Iterable[str]) -> tuple[pa.Table, list[str]]:
    """The rows of one origin shard from every piece of its crowd (only ``columns``, plus
    ``piece_index``), in piece order, and the pieces' source files (by piece index)."""
    columns = list(columns)
    compacted: list[pa.Table] = []
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    pieces = read_piece_list(task.piece_list)
    for index, piece in enumerate(pieces):
        batch = read_spill(piece, REPORT_SPILL_SCHEMA)
        hashes = batch.column("origin_hash").to_numpy()
        begin, end = core.shard_row_range(hashes, task.shard, task.bits)
        if end > begin:
            part = batch.slice(begin, end - begin).select(columns)
            part = part.append_column(PIECE_INDEX, pa.array(np.full(end - begin, index, np.int64)))
            held.append(part)
            held_bytes += piece.length
        if held_bytes >= _COMPACT_BYTES:
            compacted.append(pa.Table.from_batches(held).combine_chunks())
            held, held_bytes = [], 0
    if held:
        compacted.append(pa.Table.from_batches(held).combine_chunks())
    sources = [piece.source for piece in pieces]
    if not compacted:
        empty = REPORT_SPILL_SCHEMA.empty_table().select(columns)
        return empty.append_column(PIECE_INDEX, pa.array([], pa.int64())), sources
    return pa.concat_tables(compacted), sources
