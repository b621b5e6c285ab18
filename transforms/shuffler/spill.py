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
import os
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
    """Pointer to rows spilled as one Arrow IPC stream (schema, dictionaries, record batches):
    bytes ``offset .. offset + length - 1`` of the spill file at ``path``.

    ``fences`` (report pieces of more than :data:`CHUNK_ROWS` rows, :func:`pack_ints`): the
    stream's hash-sorted rows come in record batches (chunks) of about ``CHUNK_ROWS`` rows, one
    fence row per chunk: its first and last origin hash and its byte range in the stream
    (:data:`FENCE_COLUMNS`), so that an origin shard reads only the chunks its hash range
    touches (:func:`read_shard_range`) and a bucket's shards together read it about once,
    whatever their number. ``sealed``: how many rows hold sealed-shaped payloads (-1: unknown),
    so that the replay check skips pieces with none (``replays.shard_repeats``). A report piece
    with ``sealed`` > 0 is followed in its file, right after its stream, by its replay keys
    (:func:`replay_key_bytes`: 12 bytes per sealed row), all the bucket-wide replay check reads
    of it unless a key repeats (``replays.bucket_repeats``).

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
    sealed: int = -1
    fences: bytes = b""

    def __reduce__(self) -> tuple:
        return (_piece, tuple(self))


def _piece(
    path: str,
    offset: int,
    length: int,
    rows: int,
    source: str,
    min_crowd: int,
    sealed: int = -1,
    fences: bytes = b"",
) -> Piece:
    return Piece(
        sys.intern(path), offset, length, rows, sys.intern(source), min_crowd, sealed, fences
    )


class ShardTask(NamedTuple):
    """One origin shard of a bucket: rows with hash top ``bits`` bits equal to ``shard``.

    ``piece_list`` points to the bucket's list of pieces (:func:`write_piece_list`), so that a
    task stays small however many input batches the bucket came from. ``repeats``: the shard's
    rows that replay a sealed payload of another row of the bucket
    (``replays.shard_repeat_keys``; empty: none, or one shard, which finds its own).
    """

    shard: int
    bits: int
    piece_list: Piece
    repeats: bytes = b""


class ShardCount(NamedTuple):
    """Per crowd of a shard (``crowds``: key texts, sorted, :func:`pack_texts`): distinct
    respondents (origins, presence or data), kept data messages and the largest
    min_crowd_size of its rows. ``candidates``: the shard's screened data messages, spilled
    once by the count (:data:`CANDIDATE_SPILL_SCHEMA`), so that its deletion reads them in
    one piece and screens nothing again."""

    task: ShardTask
    crowds: bytes
    respondents: bytes  # pack_ints, one per crowd (as are the arrays of the classes below)
    messages: bytes
    min_crowd: bytes
    candidates: Piece | None = None


class DeletionTask(NamedTuple):
    """Per released crowd of a shard: delete ``respondents_deleted`` of its ``respondents``
    origins; scatter the surviving messages (of the shard's ``candidates``,
    :class:`ShardCount`) over 2**slot_bits uniform slots (merged into the bucket's output
    groups later). ``crowds``: key texts, :func:`pack_texts`."""

    task: ShardTask
    crowds: bytes
    respondents: bytes
    respondents_deleted: bytes
    slot_bits: int
    candidates: Piece | None = None


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


# Spill files hold Arrow IPC streams (schema, dictionaries, record batches) of one of these
# schemas, one after another, so that a piece is read with one seek and one read (a shard of a
# fenced piece: two, the stream's head and its chunks' bytes).
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
# A shard's data messages that passed screening, as released rows plus each one's origin code:
# the rank of its origin hash among its crowd's distinct counted origin hashes in the shard
# (``steps.origin_codes``), all deletion needs of an origin.
CANDIDATE_SPILL_SCHEMA = pa.schema([*RELEASED_SPILL_SCHEMA, ("origin_code", pa.int64())])
_PIECE_TYPES = {"path": pa.string(), "source": pa.string(), "fences": pa.binary()}
PIECE_LIST_SCHEMA = pa.schema(
    [(name, _PIECE_TYPES.get(name, pa.int64())) for name in Piece._fields]
)
# Rows per chunk of a fenced report piece: small enough that a shard of a few thousand rows per
# piece reads little beyond its own (at most the two chunks it shares with its neighbours), big
# enough that a chunk's IPC message header (~0.5 KB) is about 2% of its bytes.
CHUNK_ROWS = 512
# Columns of a piece's fences (one row per chunk); hashes as int64 bit patterns.
FENCE_COLUMNS = ("first_hash", "last_hash", "byte_begin", "byte_end")
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


def entries_in_use(column: pa.DictionaryArray) -> tuple[np.ndarray, np.ndarray]:
    """A dictionary column's indices and, per dictionary entry, whether a row uses it: found by
    marking them (a dictionary's codes are dense), not by sorting the rows."""
    indices = column.indices.to_numpy(zero_copy_only=False)
    present = np.zeros(len(column.dictionary), dtype=bool)
    present[indices] = True
    return indices, present


def own_dictionary(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its ``crowd`` column (if any) re-encoded over only the crowds it holds (a
    slice keeps its parent's whole dictionary, which would be spilled with every piece)."""
    index = batch.schema.get_field_index("crowd")
    if index < 0 or batch.num_rows == 0:
        return batch
    column = batch.column(index)
    indices, present = entries_in_use(column)
    if present.all():
        return batch
    used = np.flatnonzero(present)
    codes = (np.cumsum(present, dtype=np.int32) - 1)[indices]
    compact = pa.DictionaryArray.from_arrays(
        pa.array(codes), column.dictionary.take(pa.array(used))
    )
    return batch.set_column(index, "crowd", compact)


class Spilled(NamedTuple):
    """Where :func:`write_spill` wrote one batch: its stream's bytes in the file and its
    fences (``b""``: one record batch)."""

    offset: int
    length: int
    fences: bytes


def _write_stream(sink: pa.NativeFile, batch: pa.RecordBatch, chunk_rows: int | None) -> bytes:
    """Write one Arrow IPC stream of ``batch`` at ``sink``'s position; with ``chunk_rows``
    (rows sorted by ``origin_hash``) and more rows than that, in chunks of ``chunk_rows`` after
    an empty batch that carries the dictionaries. Returns the chunks' fences (their byte ranges
    from the stream's start; ``b""``: one record batch)."""
    batch = own_dictionary(batch)
    if chunk_rows is None or batch.num_rows <= chunk_rows:
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return b""
    start = sink.tell()
    starts = np.arange(0, batch.num_rows, chunk_rows)
    ends = np.minimum(starts + chunk_rows, batch.num_rows)
    hashes = batch.column("origin_hash").to_numpy().view(np.int64)
    fences = np.empty((starts.size, len(FENCE_COLUMNS)), dtype=np.int64)
    fences[:, 0] = hashes[starts]
    fences[:, 1] = hashes[ends - 1]
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(_empty_like(batch))  # the dictionaries: the head of every shard's read
        for index, (begin, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            fences[index, 2] = sink.tell() - start
            writer.write_batch(batch.slice(begin, end - begin))
            fences[index, 3] = sink.tell() - start
    return pack_ints(fences)


def _stream(batch: pa.RecordBatch, chunk_rows: int | None) -> tuple[pa.Buffer, bytes]:
    """:func:`_write_stream` into memory: the stream's bytes and its fences."""
    sink = pa.BufferOutputStream()
    fences = _write_stream(sink, batch, chunk_rows)
    return sink.getvalue(), fences


# Bytes a local spill file is written in (pyarrow's buffered stream over the file).
_WRITE_BUFFER_BYTES = 1 << 20


_NO_ROWS = pa.array([], pa.int32())


def _empty_like(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of no rows with ``batch``'s schema and dictionaries. (Arrow's IPC writer writes a
    zero-length slice with all its parent's buffers: ``batch.slice(0, 0)`` would put every row
    of the piece into the stream's head, which every shard reads.)"""
    return batch.take(_NO_ROWS)


def write_spill(
    path: str,
    batches: list[pa.RecordBatch],
    chunk_rows: int | None = None,
    trailers: list[bytes] | None = None,
) -> list[Spilled]:
    """Write record batches to a new spill file at ``path`` as consecutive Arrow IPC streams
    (each with its schema and dictionaries); returns where each one went. ``chunk_rows``: rows
    sorted by ``origin_hash`` are fenced (see :class:`Piece`). ``trailers``: bytes written right
    after each batch's stream (outside its ``length``), e.g. its replay keys."""
    if trailers is not None and len(trailers) != len(batches):
        raise ValueError(f"{len(trailers)} trailers for {len(batches)} batches")
    if FileSystems.get_scheme(path) is None:
        return _write_local_spill(path, batches, chunk_rows, trailers)
    positions = []
    offset = 0
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for index, batch in enumerate(batches):
            message, fences = _stream(batch, chunk_rows)
            handle.write(memoryview(message))
            positions.append(Spilled(offset, message.size, fences))
            offset += message.size
            if trailers is not None and trailers[index]:
                handle.write(trailers[index])
                offset += len(trailers[index])
    return positions


def _write_local_spill(
    path: str,
    batches: list[pa.RecordBatch],
    chunk_rows: int | None,
    trailers: list[bytes] | None,
) -> list[Spilled]:
    """:func:`write_spill` of a local path: the streams written straight into the file through
    a buffer, not each made whole in memory first (a growing buffer, then a copy into the file):
    a 50,000-report batch's 16 bucket pieces in 4.9-6.8 ms against 7.9-10.1 ms."""
    try:
        raw = pa.OSFile(path, "wb")
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        raw = pa.OSFile(path, "wb")
    positions = []
    with raw, pa.BufferedOutputStream(raw, _WRITE_BUFFER_BYTES) as sink:
        for index, batch in enumerate(batches):
            offset = sink.tell()
            fences = _write_stream(sink, batch, chunk_rows)
            positions.append(Spilled(offset, sink.tell() - offset, fences))
            if trailers is not None and trailers[index]:
                sink.write(trailers[index])
    return positions


# Replay keys (Piece): per sealed row, a uint64 key then, after all keys, the row's uint32
# position in the piece.
REPLAY_KEY_BYTES = 12


def replay_key_bytes(keys: np.ndarray, rows: np.ndarray) -> bytes:
    """A report piece's replay keys as written after its stream: ``keys`` (uint64, one per
    sealed row) then ``rows`` (the rows' positions in the piece), little-endian."""
    return np.asarray(keys, "<u8").tobytes() + np.asarray(rows, "<u4").tobytes()


def replay_keys_of(data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)`` of bytes :func:`replay_key_bytes` wrote."""
    count = len(data) // REPLAY_KEY_BYTES
    keys = np.frombuffer(data, dtype="<u8", count=count)
    rows = np.frombuffer(data, dtype="<u4", count=count, offset=8 * count)
    return keys.astype(np.uint64), rows.astype(np.int64)


def read_replay_keys(piece: Piece) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)`` of a report piece with ``sealed`` > 0 (:func:`replay_key_bytes`): its
    trailer alone is read, 12 bytes per sealed row."""
    begin = piece.offset + piece.length
    return replay_keys_of(
        _read_ranges(piece.path, [(begin, begin + REPLAY_KEY_BYTES * max(piece.sealed, 0))])
    )


class OpenSpill:
    """Local spill files held open for the reads of one bundle (:meth:`close` at its end), so
    that the shards of a bundle that read slices of the same files open each file once. Scoped
    to a bundle: no file stays open past the work that reads it; at most ``limit`` at once (the
    one opened first is closed to make room), whatever the number of input batches."""

    def __init__(self, limit: int = 128) -> None:
        self._files: dict[str, int] = {}
        self._limit = limit

    def descriptor(self, path: str) -> int:
        """An open read-only descriptor of the local file ``path``."""
        found = self._files.get(path)
        if found is None:
            if len(self._files) >= self._limit:
                os.close(self._files.pop(next(iter(self._files))))
            found = self._files[path] = os.open(path, os.O_RDONLY)
        return found

    def close(self) -> None:
        files, self._files = self._files, {}
        for descriptor in files.values():
            os.close(descriptor)


def _read_ranges(
    path: str, ranges: list[tuple[int, int]], files: OpenSpill | None = None
) -> memoryview:
    """The bytes ``[begin, end)`` of each range of a spill file, one after another in one
    buffer (local files: one ``preadv`` per range straight into it, no copy); ``files``: the
    bundle's open files to read through."""
    total = sum(end - begin for begin, end in ranges)
    buffer = memoryview(np.empty(total, dtype=np.uint8))
    at = 0
    if FileSystems.get_scheme(path) is None:
        descriptor = files.descriptor(path) if files is not None else os.open(path, os.O_RDONLY)
        try:
            for begin, end in ranges:
                got = _pread_into(descriptor, buffer[at : at + end - begin], begin)
                if got != end - begin:
                    raise RuntimeError(f"spill file {path} is shorter than expected")
                at += got
        finally:
            if files is None:
                os.close(descriptor)
        return buffer
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for begin, end in ranges:
            handle.seek(begin)
            part = handle.read(end - begin)
            if len(part) != end - begin:
                raise RuntimeError(f"spill file {path} is shorter than expected")
            buffer[at : at + len(part)] = part
            at += len(part)
    return buffer


def _pread_into(descriptor: int, target: memoryview, offset: int) -> int:
    """Read ``len(target)`` bytes at ``offset`` into ``target``; returns the bytes read."""
    if hasattr(os, "preadv"):
        done = 0
        while done < len(target):
            got = os.preadv(descriptor, [target[done:]], offset + done)
            if not got:
                break
            done += got
        return done
    part = os.pread(descriptor, len(target), offset)
    target[: len(part)] = part
    return len(part)


def _stream_table(data: memoryview, path: str, schema: pa.Schema | None) -> pa.Table:
    """The record batches of an IPC stream's bytes as the chunks of a table (no copy)."""
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    if schema is not None and not reader.schema.equals(schema):
        raise RuntimeError(f"spill file {path} holds {reader.schema}, expected {schema}")
    return reader.read_all()


def _one_batch(data: memoryview, path: str, schema: pa.Schema | None) -> pa.RecordBatch:
    """The record batches of an IPC stream's bytes as one."""
    table = _stream_table(data, path, schema)
    batches = [batch for batch in table.to_batches() if batch.num_rows]
    if not batches:
        return pa.RecordBatch.from_pylist([], table.schema)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, table.schema).combine_chunks().to_batches()[0]


def read_spill(piece: Piece, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """The rows a piece points to as one record batch (one seek and one read of its bytes);
    ``schema``, when given, is checked."""
    data = _read_ranges(piece.path, [(piece.offset, piece.offset + piece.length)])
    return _one_batch(data, piece.path, schema)


def read_shard_range(piece: Piece, shard: int, bits: int) -> pa.RecordBatch:
    """The rows of a hash-sorted report piece whose origin hash's top ``bits`` bits equal
    ``shard``. A fenced piece is read only in the chunks the
    shard's hash range touches (plus the stream's head); others in full."""
    table, _ = _shard_table(piece, shard, bits)
    batches = [batch for batch in table.to_batches() if batch.num_rows]
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], REPORT_SPILL_SCHEMA)
    return table.combine_chunks().to_batches()[0]


def _shard_table(
    piece: Piece, shard: int, bits: int, files: OpenSpill | None = None
) -> tuple[pa.Table, int]:
    """:func:`read_shard_range` as a table of the stream's chunks (not copied into one), and
    the bytes read for it (which its slices hold); ``files``: the bundle's open files."""
    if bits == 0 or not piece.fences:
        data = _read_ranges(piece.path, [(piece.offset, piece.offset + piece.length)], files)
    else:
        fences = unpack_ints(piece.fences)
        first, last = fences[:, 0].view(np.uint64), fences[:, 1].view(np.uint64)
        low = np.uint64(shard << (64 - bits))
        touched = last >= low
        if shard + 1 < (1 << bits):
            touched &= first < np.uint64((shard + 1) << (64 - bits))
        chunks = np.flatnonzero(touched)
        if not chunks.size:
            return REPORT_SPILL_SCHEMA.empty_table(), 0
        head, start = int(fences[0, 2]), int(fences[chunks[0], 2])
        stop = int(fences[chunks[-1], 3])
        data = _read_ranges(
            piece.path,
            [(piece.offset, piece.offset + head), (piece.offset + start, piece.offset + stop)],
            files,
        )
    table = _stream_table(data, piece.path, REPORT_SPILL_SCHEMA)
    hashes = table.column("origin_hash").to_numpy()
    begin, end = report_rows.shard_row_range(hashes, shard, bits)
    return table.slice(begin, end - begin), len(data)


def write_piece_list(spill_dir: str, pieces: tuple[Piece, ...]) -> Piece:
    """Spill a bucket's pieces (one row each); returns the pointer to the list."""
    columns = [
        pa.array([getattr(piece, name) for piece in pieces], type=field.type)
        for name, field in zip(Piece._fields, PIECE_LIST_SCHEMA, strict=True)
    ]
    path = spill_path(spill_dir, "buckets")
    ((offset, length, _),) = write_spill(
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


def read_shard_rows(
    task: ShardTask, columns: Iterable[str], files: OpenSpill | None = None
) -> tuple[pa.Table, list[str]]:
    """The rows of one origin shard from every piece of its bucket (only ``columns``, plus
    ``piece_index``), in piece order, and the pieces' source files (by piece index). A
    ``crowd`` column comes back with one dictionary for the whole table. ``files``: the
    bundle's open spill files (:class:`OpenSpill`) to read through."""
    columns = list(columns)
    compacted: list[pa.Table] = []
    held: list[pa.Table] = []
    held_pieces: list[int] = []
    held_bytes = 0
    pieces = read_piece_list(task.piece_list)
    for index, piece in enumerate(pieces):
        part, read = _shard_table(piece, task.shard, task.bits, files)
        if part.num_rows:
            held.append(part)
            held_pieces.append(index)
            held_bytes += read  # Table.nbytes of a slice costs ~70 us; the bytes read bound it
        if held_bytes >= _COMPACT_BYTES:
            compacted.append(_with_piece_index(held, held_pieces, columns))
            held, held_pieces, held_bytes = [], [], 0
    if held:
        compacted.append(_with_piece_index(held, held_pieces, columns))
    sources = [piece.source for piece in pieces]
    if not compacted:
        empty = REPORT_SPILL_SCHEMA.empty_table().select(columns)
        return empty.append_column(PIECE_INDEX, pa.array([], pa.int64())), sources
    if len(compacted) == 1:
        return compacted[0], sources
    return _combined(compacted), sources


def _with_piece_index(parts: list[pa.Table], indices: list[int], columns: list[str]) -> pa.Table:
    """The ``columns`` of ``parts`` as one table of one chunk per column (dictionaries
    unified) with each row's ``piece_index`` (``indices``: one per part), selected and
    numbered once for all parts."""
    table = pa.concat_tables(parts).select(columns).unify_dictionaries().combine_chunks()
    lengths = np.fromiter((part.num_rows for part in parts), dtype=np.int64, count=len(parts))
    index = np.repeat(np.asarray(indices, dtype=np.int64), lengths)
    return table.append_column(PIECE_INDEX, pa.array(index))


def _combined(parts: list[pa.Table]) -> pa.Table:
    """One table of one chunk per column (dictionaries unified)."""
    return pa.concat_tables(parts).unify_dictionaries().combine_chunks()
