"""Avro container files in as Arrow column batches; whatever cannot be read as dead letters.

The reader walks the file block by block (:mod:`schemas.avro.container`). Good blocks are
gathered until a batch holds about ``batch_records`` records and decoded together into one Arrow
RecordBatch (one column per top-level field): flat record schemas with numpy
(:func:`schemas.avro.decode.decode_flat_blocks`, checked exactly), other schemas and any block
that check fails with fastavro, one record at a time, checking that the block holds exactly the
records its header declares. Nothing raises out of the reader and nothing is skipped silently:
every byte of the file is decoded or returned in an :class:`UnreadableChunk`, and every chunk
states how many records it held (``records``), or None when nobody can know.

- not an Avro container (bad magic, bad header): ``unreadable_file``, records unknown;
- a writer schema that is not valid, that fastavro cannot parse or that does not resolve to the
  schema the caller expects (``expect``): the whole file is ``schema_mismatch``, its records
  counted from the block headers; a codec we cannot decompress: ``unsupported_codec``, likewise;
- a block that does not decode, or declares more or fewer records than it holds:
  ``corrupt_block`` with its declared count;
- a file cut inside a block: the complete blocks are read, the cut block is ``corrupt_block``
  with its declared count (unknown if the cut is inside its header); a block whose size runs
  past the next sync marker is not a cut: the bytes up to that marker are ``corrupt_block`` with
  records unknown and reading resumes after it;
- a damaged sync marker: the block before it is ``corrupt_block`` (declared count) when the
  marker is recognizably the file's (a few bytes changed); otherwise the bytes up to the next
  sync marker are ``corrupt_block`` with records unknown, and reading resumes after it.
"""

from __future__ import annotations

import copy
import functools
import io
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

import fastavro
import pyarrow as pa

from schemas.avro import container
from schemas.avro.columns import ColumnError, records_to_batch
from schemas.avro.container import ByteStream, Corrupt, Header, Truncated
from schemas.avro.decode import FlatField, decode_flat_blocks, flat_layout
from schemas.avro.schema import (
    min_record_bytes,
    project,
    resolution_problem,
    strip_logical_types,
)
from schemas.dead_letters import dead_letter

__all__ = [
    "DEFAULT_BATCH_RECORDS",
    "UNREADABLE_FILE",
    "CORRUPT_BLOCK",
    "SCHEMA_MISMATCH",
    "UNSUPPORTED_CODEC",
    "ColumnBatch",
    "UnreadableChunk",
    "read_container",
    "read_container_bytes",
    "block_windows",
]

DEFAULT_BATCH_RECORDS = 50_000
# Raw bytes kept per dead-letter chunk; a longer unreadable region becomes several chunks.
MAX_RAW_BYTES = 8 << 20
# Blocks declaring more records than this are corrupt (records take >= 1 byte of at most
# MAX_DECOMPRESSED_BYTES, except for schemas whose records can be empty).
MAX_BLOCK_RECORDS = container.MAX_DECOMPRESSED_BYTES
MAX_EMPTY_RECORDS = 1 << 16
# A sync marker with at most this many bytes changed is the file's marker, damaged.
_DAMAGED_SYNC_BYTES = 4
# Bytes read at a time for the header of a window (a header is a few kB; more is read if needed).
_HEADER_CHUNK = 1 << 16

UNREADABLE_FILE = "unreadable_file"
CORRUPT_BLOCK = "corrupt_block"
SCHEMA_MISMATCH = "schema_mismatch"
UNSUPPORTED_CODEC = "unsupported_codec"


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
    """Bytes ``offset .. offset + length - 1`` of ``source`` that could not be decoded, holding
    ``records`` records (None: unknown, e.g. a file that is no Avro at all)."""

    source: str
    offset: int
    length: int
    reason: str
    detail: str
    raw: bytes
    records: int | None

    @property
    def position(self) -> str:
        return f"{self.source}@{self.offset}"

    def dead_letter(self, stage: str) -> dict[str, Any]:
        """The dead-letter record (schemas/dead_letter.avsc) for these bytes, rejected by stage."""
        held = "unknown records" if self.records is None else f"{self.records} records"
        return dead_letter(
            stage,
            self.reason,
            f"{self.detail} ({self.length} bytes, {held})",
            self.position,
            original_bytes=self.raw,
        )


@dataclass(frozen=True)
class _Bad:
    """Why a block is corrupt and how many records it held (None: unknown)."""

    detail: str
    records: int | None


@dataclass(frozen=True)
class _Block:
    offset: int
    count: int
    data: memoryview  # as stored (compressed): a view into ``framed``
    framed: bytes  # count, size, data, sync: the block's bytes in the file


def read_container_bytes(
    data: bytes,
    source: str = "<bytes>",
    batch_records: int = DEFAULT_BATCH_RECORDS,
    expect: Mapping[str, Any] | None = None,
) -> Iterator[ColumnBatch | UnreadableChunk]:
    """:func:`read_container` on an in-memory file."""
    yield from read_container(io.BytesIO(data), source, batch_records, expect)


def read_container(
    fileobj: BinaryIO,
    source: str,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    expect: Mapping[str, Any] | None = None,
    read_chunk: int = container.READ_CHUNK,
    window: tuple[int, int, int] | None = None,
) -> Iterator[ColumnBatch | UnreadableChunk]:
    """Stream an Avro container file as column batches of about ``batch_records`` records and
    unreadable chunks, in file order (see the module docstring). With ``expect`` (a flat record
    schema, e.g. ``schemas.schema_json("report")``), batches have exactly its fields and types.

    ``window``: ``(start, stop, first record)``: only the whole blocks in bytes ``start .. stop
    - 1`` of a seekable file (as ``container.walk_blocks`` found them), whose first record is
    the file's record ``first record``; the header is read, the bytes before ``start`` are not.
    A file whose header cannot be decoded yields one chunk for the window, records unknown."""
    if batch_records < 1:
        raise ValueError(f"batch_records must be >= 1, got {batch_records}")
    # A window's header is read in small chunks: the blocks are read from the window's start.
    stream = ByteStream(fileobj, read_chunk if window is None else _HEADER_CHUNK)
    try:
        header = container.read_header(stream)
    except Exception as error:  # noqa: BLE001 - any header problem makes the file unreadable
        yield from _unreadable_file(source, stream, f"unreadable header: {error}")
        return
    plan = _file_problem(header, expect)
    reason, detail = plan.reason, plan.detail
    decoder = None if reason else _BlockDecoder(source, plan, header.codec, expect)
    pending: list[_Block] = []
    pending_records = pending_bytes = 0
    next_record = 0
    # Most bytes gathered before decoding: dead files keep their chunks small.
    most_bytes = MAX_RAW_BYTES if decoder is None else container.MAX_DECOMPRESSED_BYTES
    if window is not None:
        start, stop, next_record = window
        if decoder is None:
            yield UnreadableChunk(source, start, stop - start, reason, detail, b"", None)
            return
        fileobj.seek(start)
        stream = ByteStream(io.BytesIO(fileobj.read(stop - start)), read_chunk, start=start)
        head = b""
    else:
        # A file whose blocks cannot be decoded: its header goes with its first chunk.
        stream.rewind(0)
        head = b"" if decoder is not None else stream.read_exact(header.end)
        stream.rewind(header.end)

    def flush() -> Iterator[ColumnBatch | UnreadableChunk]:
        nonlocal next_record, head
        if decoder is not None:
            # A record's number is its place by the blocks' declared counts (a good block holds
            # exactly its count), so a window (block_windows) numbers its records as this does.
            yield from decoder.decode(pending, next_record)
            next_record += sum(block.count for block in pending)
            return
        yield _dead_blocks(source, pending, reason, detail, head)
        head = b""

    for event in _frames(source, stream, header):
        if isinstance(event, _Block):
            pending.append(event)
            pending_records += event.count
            pending_bytes += len(event.framed)
            if pending_records >= batch_records or pending_bytes > most_bytes:
                yield from flush()
                pending, pending_records, pending_bytes = [], 0, 0
            continue
        if pending or head:
            yield from flush()
            pending, pending_records, pending_bytes = [], 0, 0
        yield event
    if pending or head:
        yield from flush()


def block_windows(
    fileobj: BinaryIO, max_records: int, expect: Mapping[str, Any] | None = None
) -> list[tuple[int, int, int, int]] | None:
    """``(start, stop, first record, records)`` of consecutive runs of whole blocks of a seekable
    file, each of at most ``max_records`` records (a larger block is a run of its own), covering
    every block: the windows :func:`read_container` reads separately. None when the file must be
    read from start to end: a header or block walk that fails (``container.walk_blocks``), a
    schema or codec it cannot decode, or no block at all.

    The windows are as even as the blocks allow: as few as ``max_records`` permits (W, what
    filling each run while it fits gives), their largest as small as W runs of whole blocks can
    make it (the least cap under which runs so filled are still W, found by bisection). A
    file of 20,127 records in blocks of 2,100 read at 10,030 is 6,300 + 6,300 + 7,527 records,
    not 8,400 + 8,400 + 3,327: workers handed a fixed number of windows each then get about the
    same work."""
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    try:
        header, blocks = container.walk_blocks(fileobj, MAX_BLOCK_RECORDS)
    except Exception:  # noqa: BLE001 - whatever is wrong, the whole-file reader reports it
        return None
    if not blocks or _file_problem(header, expect).reason:
        return None
    counts = [block.count for block in blocks]
    cap = max_records
    wanted = len(_run_ends(counts, cap))  # the fewest runs within max_records
    low = -(-sum(counts) // wanted)
    while low < cap:  # the least cap that still gives that many
        middle = (low + cap) // 2
        if len(_run_ends(counts, middle)) <= wanted:
            cap = middle
        else:
            low = middle + 1
    windows: list[tuple[int, int, int, int]] = []
    begin, first = 0, 0
    for end in _run_ends(counts, cap):
        records = sum(counts[begin:end])
        windows.append((blocks[begin].offset, blocks[end - 1].end, first, records))
        begin, first = end, first + records
    return windows


def _run_ends(counts: Sequence[int], cap: int) -> list[int]:
    """Where runs of consecutive blocks of ``counts`` records end (exclusive block indices),
    each run filled while it stays within ``cap`` records (a larger block is a run of its own)."""
    ends: list[int] = []
    records = 0
    for index, count in enumerate(counts):
        if records and records + count > cap:
            ends.append(index)
            records = 0
        records += count
    ends.append(len(counts))
    return ends


class _SchemaPlan(NamedTuple):
    """What a file's header says about decoding its blocks: ``reason`` ("" when they can be
    decoded) and ``detail``; else the stripped writer schema, fastavro's parse of it, its flat
    layout (None: not flat) and the fewest bytes a record takes."""

    reason: str
    detail: str
    schema: Any
    parsed: Any = None
    layout: tuple[FlatField, ...] | None = None
    min_bytes: int = 0


def _file_problem(header: Header, expect: Mapping[str, Any] | None) -> _SchemaPlan:
    """The :class:`_SchemaPlan` of a file's header, the same for every file of one writer
    schema and codec read as ``expect``: a release's files (and each range of one that is
    read apart) share it, worked out once (~0.3 ms: JSON, schema resolution, fastavro's
    parse)."""
    expect_text = None if expect is None else json.dumps(expect, sort_keys=True, default=dict)
    return _schema_plan(header.metadata.get("avro.schema"), header.codec, expect_text)


@functools.lru_cache(maxsize=64)
def _schema_plan(schema_text: bytes | None, codec: str, expect_text: str | None) -> _SchemaPlan:
    expect = None if expect_text is None else json.loads(expect_text)
    try:
        writer = Header(
            {} if schema_text is None else {"avro.schema": schema_text}, b"", 0
        ).schema()
        stripped = strip_logical_types(writer)
        parsed = fastavro.parse_schema(copy.deepcopy(stripped))
    except Exception as error:  # noqa: BLE001 - JSON, Avro or recursion errors alike
        return _SchemaPlan(SCHEMA_MISMATCH, f"writer schema is not valid Avro: {error}", None)
    if not container.codec_available(codec):
        return _SchemaPlan(UNSUPPORTED_CODEC, f"codec {codec!r} cannot be read here", None)
    if expect is not None:
        try:
            problem = resolution_problem(writer, expect)
        except Exception as error:  # noqa: BLE001
            problem = f"writer schema cannot be resolved: {error}"
        if problem:
            detail = f"not readable as {expect.get('name')}: {problem}"
            return _SchemaPlan(SCHEMA_MISMATCH, detail, None)
    return _SchemaPlan("", "", stripped, parsed, flat_layout(stripped), min_record_bytes(stripped))


def _unreadable_file(source: str, stream: ByteStream, detail: str) -> Iterator[UnreadableChunk]:
    """The whole file as ``unreadable_file`` chunks of unknown records."""
    for offset, piece in stream.read_to_end(0, MAX_RAW_BYTES):
        if piece or offset == 0:
            yield UnreadableChunk(source, offset, len(piece), UNREADABLE_FILE, detail, piece, None)


def _dead_blocks(
    source: str, blocks: list[_Block], reason: str, detail: str, head: bytes
) -> UnreadableChunk:
    """Readable blocks of a file that cannot be decoded as one chunk holding their declared
    records (with the file's header bytes ``head`` in front for the file's first chunk)."""
    raw = head + b"".join(block.framed for block in blocks)
    offset = 0 if head else blocks[0].offset
    records = sum(block.count for block in blocks)
    return UnreadableChunk(source, offset, len(raw), reason, detail, raw, records)


def _frames(source: str, stream: ByteStream, header: Header) -> Iterator[_Block | UnreadableChunk]:
    """Every block of the file, or a chunk for the bytes where no block could be read."""
    sync = header.sync
    while not stream.at_end():
        start = stream.position
        stream.release_before(start)
        try:
            count = stream.read_long()
            size = stream.read_long()
            if not (0 <= count <= MAX_BLOCK_RECORDS and 0 <= size <= container.MAX_BLOCK_BYTES):
                raise Corrupt(f"implausible block header: count={count}, size={size}")
        except Corrupt as error:
            yield from _resync(source, stream, sync, start, f"unreadable block: {error}")
            continue
        data_start = stream.position
        try:
            stream.skip(size)
            marker = stream.read_exact(container.SYNC_SIZE)
        except Truncated:  # everything up to the end is buffered now
            if stream.find_buffered(sync, data_start) >= 0:  # not short: the size is wrong
                detail = f"block size {size} runs past the next sync marker"
                yield from _resync(source, stream, sync, start, detail)
                continue
            detail = f"file ends inside a block of {count} records (truncated)"
            yield from _rest_of_file(source, stream, start, detail, count)
            return
        end = stream.position
        stream.rewind(start)
        framed = stream.read_exact(end - start)
        if marker == sync:
            data = memoryview(framed)[data_start - start : data_start - start + size]
            yield _Block(start, count, data, framed)
            continue
        if sum(a != b for a, b in zip(marker, sync, strict=True)) > _DAMAGED_SYNC_BYTES:
            detail = "no sync marker after the block (block size or marker damaged)"
            yield from _resync(source, stream, sync, start, detail)
            continue
        detail = f"sync marker after a block of {count} records is damaged"
        yield UnreadableChunk(source, start, len(framed), CORRUPT_BLOCK, detail, framed, count)


def _rest_of_file(
    source: str, stream: ByteStream, start: int, detail: str, records: int
) -> Iterator[UnreadableChunk]:
    """The bytes from ``start`` to the end as chunks; the first one holds ``records``."""
    for offset, piece in stream.read_to_end(start, MAX_RAW_BYTES):
        if piece:
            held = records if offset == start else 0
            yield UnreadableChunk(source, offset, len(piece), CORRUPT_BLOCK, detail, piece, held)


def _resync(
    source: str, stream: ByteStream, sync: bytes, start: int, detail: str
) -> Iterator[UnreadableChunk]:
    """The bytes from ``start`` through the next sync marker (or the end) as chunks of unknown
    records (the block header that would say how many is unreadable)."""
    for offset, piece in stream.scan_for(sync, start, MAX_RAW_BYTES):
        yield UnreadableChunk(source, offset, len(piece), CORRUPT_BLOCK, detail, piece, None)


class _BlockDecoder:
    """Decodes groups of good blocks of one file: all at once with numpy when the schema is a
    flat record, else (or when that cannot vouch for the group) block by block, isolating the
    blocks that fail."""

    def __init__(
        self, source: str, plan: _SchemaPlan, codec: str, expect: Mapping[str, Any] | None
    ) -> None:
        self._source = source
        self._schema = plan.schema
        self._parsed = plan.parsed
        self._codec = codec
        self._expect = expect
        self._layout = plan.layout
        self._min_bytes = plan.min_bytes

    def _chunk(
        self, block: _Block, reason: str, detail: str, records: int | None = -1
    ) -> UnreadableChunk:
        held = block.count if records == -1 else records
        return UnreadableChunk(
            self._source, block.offset, len(block.framed), reason, detail, block.framed, held
        )

    def _finish(
        self, blocks: list[_Block], batch: pa.RecordBatch, first_record: int
    ) -> Iterator[ColumnBatch | UnreadableChunk]:
        try:
            if self._expect is not None:
                batch = project(batch, self._expect)
        except ColumnError as error:
            for block in blocks:
                yield self._chunk(block, SCHEMA_MISMATCH, str(error))
            return
        yield ColumnBatch(self._source, first_record, batch)

    def decode(
        self, blocks: list[_Block], first_record: int
    ) -> Iterator[ColumnBatch | UnreadableChunk]:
        if not blocks:
            return
        contents: list[bytes | None] = []
        errors: list[str] = []
        for block in blocks:
            try:
                contents.append(container.decompress(self._codec, block.data))
                errors.append("")
            except Corrupt as error:
                contents.append(None)
                errors.append(str(error))
        if self._layout is not None and all(content is not None for content in contents):
            fast = self._fast(contents, [block.count for block in blocks])
            if fast is not None:
                yield from self._finish(blocks, fast, first_record)
                return
        run: list[tuple[_Block, Any]] = []
        for block, content, error in zip(blocks, contents, errors, strict=True):
            decoded = (
                _Bad(error, block.count)
                if error
                else self._decode_block(content or b"", block.count)
            )
            if isinstance(decoded, _Bad):
                for item in self._flush(run, first_record):
                    if isinstance(item, ColumnBatch):
                        first_record += item.rows
                    yield item
                run = []
                yield self._chunk(block, CORRUPT_BLOCK, decoded.detail, decoded.records)
                first_record += block.count  # records are numbered by the declared counts
            else:
                run.append((block, decoded))
        yield from self._flush(run, first_record)

    def _fast(self, contents: list[Any], counts: list[int]) -> pa.RecordBatch | None:
        assert self._layout is not None
        try:
            return decode_flat_blocks(self._layout, contents, counts)
        except Exception:  # noqa: BLE001 - whatever the bytes, the slow path decides
            return None

    def _decode_block(self, content: bytes, count: int) -> pa.RecordBatch | list[Any] | _Bad:
        """The records of one block (a batch or fastavro's records), or why it is corrupt."""
        if self._layout is not None:
            fast = self._fast([content], [count])
            if fast is not None:
                return fast
        if count * self._min_bytes > len(content) or (
            self._min_bytes == 0 and count > MAX_EMPTY_RECORDS
        ):
            return self._bad(
                content, count, f"block declares {count} records but holds {len(content)} bytes"
            )
        handle = io.BytesIO(content)
        records = []
        try:
            for _ in range(count):
                records.append(fastavro.schemaless_reader(handle, self._parsed, None))
        except Exception as error:  # noqa: BLE001 - any decoding failure means corrupt data
            detail = (
                f"block declares {count} records but record {len(records) + 1} does not "
                f"decode ({type(error).__name__}: {error})"
            )
            return self._bad(content, count, detail)
        left = len(content) - handle.tell()
        if left:
            detail = f"block declares {count} records but {left} bytes remain after them"
            return self._bad(content, count, detail)
        if self._layout is not None:
            try:
                return records_to_batch(records, self._schema)
            except ColumnError as error:
                return _Bad(str(error), count)
        return records

    def _bad(self, content: bytes, count: int, detail: str) -> _Bad:
        """A corrupt block holding as many records as its bytes decode to exactly (a header that
        understates or overstates its count), else as many as its header declares."""
        held = self._records_held(content)
        if held is None or held == count:
            return _Bad(detail, None if self._min_bytes == 0 else count)
        return _Bad(f"{detail}; its bytes hold exactly {held} records", held)

    def _records_held(self, content: bytes) -> int | None:
        """How many records ``content`` decodes to, ending exactly at its end; None if it does
        not (damaged bytes) or when records can be empty (no bound on their number)."""
        if self._min_bytes == 0:
            return None
        handle = io.BytesIO(content)
        held = 0
        try:
            while handle.tell() < len(content):  # at most len(content) / min_bytes records
                fastavro.schemaless_reader(handle, self._parsed, None)
                held += 1
        except Exception:  # noqa: BLE001 - damaged bytes
            return None
        return held

    def _flush(
        self, run: list[tuple[_Block, Any]], first_record: int
    ) -> Iterator[ColumnBatch | UnreadableChunk]:
        """Decoded blocks in a row as one batch (per block if their columns do not agree)."""
        if not run:
            return
        blocks = [block for block, _ in run]
        try:
            if self._layout is None:
                records = [record for _, decoded in run for record in decoded]
                batch = records_to_batch(records, self._schema)
            else:
                table = pa.Table.from_batches([decoded for _, decoded in run])
                batch = table.combine_chunks().to_batches()[0] if table.num_rows else run[0][1]
        except (ColumnError, pa.ArrowException) as error:
            if len(run) == 1:
                yield self._chunk(blocks[0], SCHEMA_MISMATCH, str(error))
                return
            for one in run:
                for item in self._flush([one], first_record):
                    if isinstance(item, ColumnBatch):
                        first_record += item.rows
                    yield item
            return
        yield from self._finish(blocks, batch, first_record)
