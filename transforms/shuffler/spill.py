"""The shuffler's spill format: rows written once as Arrow IPC record batches, read by pointer.

Only small pointers (:class:`Piece`: file, byte range, rows) travel through Beam's shuffles; the
rows themselves are spilled to files under the run's spill directory (shuffler-private, under
``--private-output``, never inside a release) and read back by the shard or group that needs
them, so no worker holds a bucket of crowds, a window or a file in memory. The unit of work is
a crowd bucket (``schemas/release/crowd_buckets.py``): a piece holds the rows of many crowds of one
bucket, each row naming its crowd in the dictionary-encoded column ``crowd`` (the crowd's key
text, :func:`crowd_text`), so a crowd costs one dictionary entry per piece, not a pointer.

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

import json
import secrets
import struct
import sys
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.shuffler import report_rows

# (window_start_ms, instance, channel, recipe, crowd)
CrowdKey = tuple[int, int, str, str, str | None]


def crowd_text(channel: str, recipe_id: str, crowd_id: str | None) -> str:
    """The key text of a crowd inside its bucket (the JSON that ``crowd_bucket`` digests)."""
    return json.dumps([channel, recipe_id, crowd_id], separators=(",", ":"), ensure_ascii=False)


def crowd_of_text(text: str) -> tuple[str, str, str | None]:
    """``(channel, recipe_id, crowd_id)`` of a :func:`crowd_text`."""
    channel, recipe_id, crowd_id = json.loads(text)
    return channel, recipe_id, crowd_id


# Crowd key texts are JSON, in which a NUL character is always escaped: NUL separates them.
_SEPARATOR = "\0"


def pack_texts(texts: Sequence[str]) -> bytes:
    """Crowd key texts as ONE bytes object (NUL-joined UTF-8, zlib level 1), in their order.

    What crosses a grouping holds its crowds this way, never as one Python string per crowd:
    a runner that keeps grouped values decoded (FnApiRunner) holds a bucket's crowds as one
    object instead of hundreds, so memory does not grow with the number of crowds."""
    if not texts:
        return b""
    return zlib.compress(_SEPARATOR.join(texts).encode(), 1)


def unpack_texts(packed: bytes) -> list[str]:
    """The texts :func:`pack_texts` packed."""
    if not packed:
        return []
    return zlib.decompress(packed).decode().split(_SEPARATOR)


def pack_ints(values: np.ndarray | Sequence[int]) -> bytes:
    """A 1-D or 2-D array of integers (per-crowd counts) as ONE bytes object: its shape, then
    its int64 values compressed (zlib level 1: small counts compress to about a byte each).

    Like :func:`pack_texts`: a decoded grouping holds a bucket's counts as one small object,
    not as 8 bytes or more per crowd and column."""
    array = np.ascontiguousarray(values, dtype="<i8")
    if array.ndim not in (1, 2):
        raise ValueError(f"pack_ints takes a 1-D or 2-D array, got {array.ndim} dimensions")
    shape = struct.pack("<B2q", array.ndim, *array.shape, *([0] * (2 - array.ndim)))
    return shape + zlib.compress(array.tobytes(), 1)


_SHAPE = struct.calcsize("<B2q")


def unpack_ints(packed: bytes) -> np.ndarray:
    """The int64 array :func:`pack_ints` packed."""
    ndim, rows, columns = struct.unpack_from("<B2q", packed)
    values = np.frombuffer(zlib.decompress(packed[_SHAPE:]), dtype="<i8").astype(np.int64)
    return values.reshape((rows, columns)[:ndim])


class Piece(NamedTuple):
    """Pointer to rows spilled as one Arrow IPC stream (schema, dictionaries, one record
    batch): bytes ``offset .. offset + length - 1`` of the spill file at ``path``.

    Unpickled pieces share their path strings (:func:`_piece`): every bucket of an input batch
    points into one spill file from one input file, and a runner that holds grouped values
    decoded (FnApiRunner) would otherwise keep two path strings per bucket and batch.
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
    """One origin shard of a bucket: rows with hash top ``bits`` bits equal to ``shard``.

    ``piece_list`` points to the bucket's list of pieces (:func:`write_piece_list`), so that a
    task stays small however many input batches the bucket came from.
    """

    shard: int
    bits: int
    piece_list: Piece


class ShardCount(NamedTuple):
    """Per crowd of a shard (``crowds``: key texts, sorted, :func:`pack_texts`): distinct
    respondents (origins, presence or data), kept data messages and the largest
    min_crowd_size of its rows."""

    task: ShardTask
    crowds: bytes
    respondents: bytes  # pack_ints, one per crowd (as are the arrays of the classes below)
    messages: bytes
    min_crowd: bytes


class DeletionTask(NamedTuple):
    """Per released crowd of a shard: delete ``respondents_deleted`` of its ``respondents``
    origins; scatter the surviving messages over 2**slot_bits uniform slots (merged into the
    bucket's output groups later). ``crowds``: key texts, :func:`pack_texts`."""

    task: ShardTask
    crowds: bytes
    respondents: bytes
    respondents_deleted: bytes
    slot_bits: int


class ShardRelease(NamedTuple):
    """What a shard released: per crowd messages deleted and released, and its surviving
    messages as one piece per slot drawn (``(slot, Piece)``). ``crowds``: key texts,
    :func:`pack_texts`."""

    crowds: bytes
    messages_deleted: bytes
    messages_released: bytes
    slot_bits: int
    pieces: tuple[tuple[int, Piece], ...]


class BucketDraft(NamedTuple):
    """A bucket's decisions: its crowds (key texts in ``crowd_order``, :func:`pack_texts`), one
    row of ``decisions`` each (``shuffle_steps.DRAFT_COLUMNS``: the manifest before its counts
    of messages deleted and released), and the slots its surviving messages are scattered
    over."""

    window_end: int
    slot_bits: int
    crowds: bytes
    decisions: bytes  # pack_ints of a (crowds, len(DRAFT_COLUMNS)) array


# Spill files hold Arrow IPC streams (schema, dictionaries, one record batch) of one of these
# schemas, one after another, so that a piece is read with one seek and one read.
CROWD_TYPE = pa.dictionary(pa.int32(), pa.string())
REPORT_SPILL_SCHEMA = pa.schema(
    [
        ("origin_hash", pa.uint64()),
        ("event_time", pa.int64()),
        ("min_crowd_size", pa.int64()),
        ("payload", pa.binary()),
        ("payload_crc32c", pa.int64()),
        ("record_index", pa.int64()),
        ("crowd", CROWD_TYPE),
    ]
)
# Report columns copied into the spill as they are (origin_hash and record_index are computed).
SPILLED_REPORT_COLUMNS = ("event_time", "min_crowd_size", "payload", "payload_crc32c")
RELEASED_SPILL_SCHEMA = pa.schema(
    [("payload", pa.binary()), ("payload_crc32c", pa.int64()), ("crowd", CROWD_TYPE)]
)
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


def own_dictionary(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its ``crowd`` column (if any) re-encoded over only the crowds it holds (a
    slice keeps its parent's whole dictionary, which would be spilled with every piece)."""
    index = batch.schema.get_field_index("crowd")
    if index < 0 or batch.num_rows == 0:
        return batch
    column = batch.column(index)
    used, codes = np.unique(column.indices.to_numpy(zero_copy_only=False), return_inverse=True)
    compact = pa.DictionaryArray.from_arrays(
        pa.array(codes.reshape(-1).astype(np.int32)), column.dictionary.take(pa.array(used))
    )
    return batch.set_column(index, "crowd", compact)


def write_spill(path: str, batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    """Write record batches to a new spill file at ``path`` as consecutive Arrow IPC streams
    (each with its schema and dictionaries); returns each one's ``(offset, length)``."""
    positions = []
    offset = 0
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for batch in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(own_dictionary(batch))
            message = sink.getvalue()
            handle.write(memoryview(message))
            positions.append((offset, message.size))
            offset += message.size
    return positions


def read_spill(piece: Piece, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """The record batch a piece points to (one seek and one read of its bytes); ``schema``,
    when given, is checked."""
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
    batch = pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()
    if schema is not None and not batch.schema.equals(schema):
        raise RuntimeError(f"spill file {piece.path} holds {batch.schema}, expected {schema}")
    return batch


def write_piece_list(spill_dir: str, pieces: tuple[Piece, ...]) -> Piece:
    """Spill a bucket's pieces (one row each); returns the pointer to the list."""
    columns = [
        pa.array([getattr(piece, name) for piece in pieces], type=field.type)
        for name, field in zip(Piece._fields, PIECE_LIST_SCHEMA, strict=True)
    ]
    path = spill_path(spill_dir, "buckets")
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
    """The rows of one origin shard from every piece of its bucket (only ``columns``, plus
    ``piece_index``), in piece order, and the pieces' source files (by piece index). A
    ``crowd`` column comes back with one dictionary for the whole table."""
    columns = list(columns)
    compacted: list[pa.Table] = []
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    pieces = read_piece_list(task.piece_list)
    for index, piece in enumerate(pieces):
        batch = read_spill(piece, REPORT_SPILL_SCHEMA)
        hashes = batch.column("origin_hash").to_numpy()
        begin, end = report_rows.shard_row_range(hashes, task.shard, task.bits)
        if end > begin:
            part = batch.slice(begin, end - begin).select(columns)
            part = part.append_column(PIECE_INDEX, pa.array(np.full(end - begin, index, np.int64)))
            held.append(part)
            held_bytes += piece.length
        if held_bytes >= _COMPACT_BYTES:
            compacted.append(_combined(held))
            held, held_bytes = [], 0
    if held:
        compacted.append(_combined(held))
    sources = [piece.source for piece in pieces]
    if not compacted:
        empty = REPORT_SPILL_SCHEMA.empty_table().select(columns)
        return empty.append_column(PIECE_INDEX, pa.array([], pa.int64())), sources
    if len(compacted) == 1:
        return compacted[0], sources
    return _combined(compacted), sources


def _combined(parts: list[pa.RecordBatch] | list[pa.Table]) -> pa.Table:
    """One table of one chunk per column (dictionaries unified)."""
    if isinstance(parts[0], pa.RecordBatch):
        table = pa.Table.from_batches(parts)
    else:
        table = pa.concat_tables(parts)
    return table.unify_dictionaries().combine_chunks()
