"""Avro object container files: header, blocks, sync markers, codecs; one streaming writer.

Avro 1.11 specification, "Object Container Files": a file is the magic ``Obj\\x01``, a metadata
map (``avro.schema``, ``avro.codec``), a 16-byte sync marker, then blocks of ``record count
(long), byte size (long), data, sync marker``. The data of a block is its records' binary
encodings back to back, compressed by the codec (``deflate``: a raw RFC 1951 stream).

:class:`ByteStream` reads a file forward with absolute positions, never holding more than it
must: reads are chunked (a block that declares a gigabyte in a small file costs no more than the
file), and :meth:`ByteStream.scan_for` finds the next sync marker to resynchronize after a bad
block. :class:`ContainerWriter` writes pre-encoded records as blocks, streaming;
:func:`encode_container` encodes columns to a whole file with it.
"""

from __future__ import annotations

import bz2
import io
import json
import lzma
import os
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from schemas.avro.encode import encode_rows
from schemas.avro.schema import schema_for_header
from schemas.avro.varint import encode_bytes, encode_long

try:  # Intel's ISA-L inflates raw deflate about 1.7x as fast as zlib, byte for byte the same
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - a platform without its wheel
    _inflate = zlib

__all__ = [
    "MAGIC",
    "SYNC_SIZE",
    "WRITER_CODECS",
    "DEFAULT_BLOCK_BYTES",
    "Corrupt",
    "Truncated",
    "ByteStream",
    "Header",
    "read_header",
    "BlockSpan",
    "walk_blocks",
    "records_in_blocks",
    "header_bytes",
    "frame_block",
    "check_codec",
    "compress",
    "decompress",
    "ContainerWriter",
    "encode_container",
    "encode_encoded_container",
]

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
WRITER_CODECS = ("null", "deflate", "snappy")
READER_CODECS = ("null", "deflate", "snappy", "bzip2", "xz")
DEFAULT_BLOCK_BYTES = 1 << 20
# Blocks declaring more than this are treated as corrupt (writers use blocks of ~16 kB - 1 MB).
MAX_BLOCK_BYTES = 1 << 30
# A block that decompresses to more than this is treated as corrupt (a compression bomb).
MAX_DECOMPRESSED_BYTES = 1 << 28
READ_CHUNK = 1 << 20


class Corrupt(Exception):
    """The bytes at the current position are not a valid header or block."""


class Truncated(Corrupt):
    """The file ends inside a header or block."""


class ByteStream:
    """Forward-only buffered reader with absolute positions and rewind within the buffer."""

    def __init__(self, fileobj: BinaryIO, read_chunk: int = READ_CHUNK, start: int = 0) -> None:
        """``start``: the file position ``fileobj`` is read from (a window of a file)."""
        self._file = fileobj
        self._chunk = read_chunk
        self._buffer = bytearray()
        self._buffer_start = start  # file position of self._buffer[0]
        self._index = 0  # read position inside self._buffer
        self._eof = False

    @property
    def position(self) -> int:
        return self._buffer_start + self._index

    def _fill(self, needed: int) -> bool:
        # Chunked: never asks the file for more than one chunk, so a huge declared size in a
        # small file allocates no more than the file holds.
        while len(self._buffer) - self._index < needed and not self._eof:
            chunk = self._file.read(self._chunk)
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
        if drop > self._chunk:
            del self._buffer[:drop]
            self._buffer_start += drop
            self._index -= drop

    def rewind(self, position: int) -> None:
        if position < self._buffer_start:
            raise ValueError("cannot rewind behind released bytes")
        self._index = position - self._buffer_start

    def read_exact(self, count: int) -> bytes:
        if not self._fill(count):
            raise Truncated(f"file ends {count - (len(self._buffer) - self._index)} bytes short")
        chunk = bytes(self._buffer[self._index : self._index + count])
        self._index += count
        return chunk

    def skip(self, count: int) -> None:
        """Move ``count`` bytes forward (they stay buffered for a rewind)."""
        if not self._fill(count):
            raise Truncated(f"file ends {count - (len(self._buffer) - self._index)} bytes short")
        self._index += count

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
                raise Truncated("file ends inside a varint")
            byte = self._buffer[self._index]
            self._index += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise Corrupt("varint longer than 10 bytes")

    def read_bytes(self) -> bytes:
        length = self.read_long()
        if length < 0 or length > MAX_BLOCK_BYTES:
            raise Corrupt(f"invalid length {length}")
        return self.read_exact(length)

    def find_buffered(self, marker: bytes, start: int) -> int:
        """Position of the first ``marker`` at or after ``start`` among the buffered bytes (all
        the rest of the file once a read came up short), or -1."""
        found = self._buffer.find(marker, max(start - self._buffer_start, 0))
        return -1 if found < 0 else self._buffer_start + found

    def pieces(self, begin: int, end: int, size: int) -> Iterator[tuple[int, bytes]]:
        """Buffered bytes [begin, end) in pieces of at most ``size`` bytes."""
        for offset in range(begin, end, size):
            stop = min(offset + size, end)
            yield (
                offset,
                bytes(self._buffer[offset - self._buffer_start : stop - self._buffer_start]),
            )

    def read_to_end(self, start: int, piece: int) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, bytes)``: the bytes from ``start`` to the end of the file in pieces of
        ``piece`` bytes, the last one shorter (empty when the file ends on a piece boundary); each
        piece is released when the next one is asked for."""
        self.rewind(start)
        offset = start
        while True:
            chunk = self.read_up_to(piece)
            yield offset, chunk
            offset += len(chunk)
            self.release_before(offset)
            if len(chunk) < piece:
                return

    def scan_for(self, marker: bytes, start: int, piece: int) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, bytes)``: the bytes from ``start`` up to and including the next
        ``marker`` after ``start`` (or to the end of the file), in pieces of at most ``piece``
        bytes; afterwards the stream is positioned after the marker (or at the end)."""
        self.rewind(start)
        piece_start = start
        search_from = start + 1
        while True:
            local = self._buffer.find(marker, search_from - self._buffer_start)
            if local >= 0:
                end = self._buffer_start + local + len(marker)
                yield from self.pieces(piece_start, end, piece)
                self._index = end - self._buffer_start
                return
            available_end = self._buffer_start + len(self._buffer)
            if self._eof:
                yield from self.pieces(piece_start, available_end, piece)
                self._index = len(self._buffer)
                return
            # Emit whole pieces that cannot hold the start of a marker; keep the rest buffered.
            while available_end - piece_start >= piece + len(marker):
                yield from self.pieces(piece_start, piece_start + piece, piece)
                piece_start += piece
            self._index = piece_start - self._buffer_start
            self.release_before(piece_start)
            search_from = max(piece_start + 1, available_end - len(marker) + 1)
            self._index = len(self._buffer)
            self._fill(1)


@dataclass(frozen=True)
class Header:
    """A container header: metadata (raw bytes), the sync marker and the first block's offset."""

    metadata: Mapping[str, bytes]
    sync: bytes
    end: int

    @property
    def codec(self) -> str:
        return self.metadata.get("avro.codec", b"null").decode("utf-8", "replace") or "null"

    def schema(self) -> Any:
        """The writer schema (JSON); raises ValueError when it is missing or not JSON."""
        if "avro.schema" not in self.metadata:
            raise ValueError("no avro.schema in the header")
        return json.loads(self.metadata["avro.schema"])


def read_header(stream: ByteStream) -> Header:
    """The header at the start of ``stream``; raises :class:`Corrupt` if there is none."""
    if stream.read_exact(4) != MAGIC:
        raise Corrupt("not an Avro container file (bad magic bytes)")
    metadata: dict[str, bytes] = {}
    while True:
        count = stream.read_long()
        if count == 0:
            break
        if count < 0:
            count = -count
            stream.read_long()
        for _ in range(count):
            key = stream.read_bytes().decode("utf-8", "replace")
            metadata[key] = stream.read_bytes()
    sync = stream.read_exact(SYNC_SIZE)
    return Header(metadata, sync, stream.position)


@dataclass(frozen=True)
class BlockSpan:
    """One block's place in its file: bytes ``offset .. end - 1`` (count, size, data and sync
    marker) holding ``count`` records."""

    offset: int
    count: int
    end: int


# Bytes read at a block's start: its two varint longs (at most 10 bytes each).
_BLOCK_HEAD_BYTES = 20


def _long_at(data: bytes, index: int) -> tuple[int, int]:
    """The Avro long at ``data[index:]`` and the index after it; Corrupt if there is none."""
    shift = value = 0
    for position in range(index, min(index + 10, len(data))):
        byte = data[position]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), position + 1
        shift += 7
    raise Corrupt("no complete varint at a block's start")


def walk_blocks(fileobj: BinaryIO, max_records: int) -> tuple[Header, list[BlockSpan]]:
    """The header and every block of a seekable container file, found by reading each block's
    count and size and seeking over its data (a few reads per block, never the data itself).

    Raises :class:`Corrupt` unless the file is nothing but whole, plausible blocks (``count <=
    max_records``, ``size <= MAX_BLOCK_BYTES``) each followed by the header's sync marker up to
    its very end: such a file can be read in byte ranges of whole blocks, any other file only
    from start to end (``schemas.avro.reader.read_container`` says what it makes of it). The
    block data are not checked here: a block that does not decode is the reader's finding."""
    header = read_header(ByteStream(fileobj, read_chunk=1 << 16))
    size_of_file = fileobj.seek(0, os.SEEK_END)
    blocks: list[BlockSpan] = []
    position = header.end
    while position < size_of_file:
        fileobj.seek(position)
        head = fileobj.read(_BLOCK_HEAD_BYTES)
        count, index = _long_at(head, 0)
        size, index = _long_at(head, index)
        if not (0 <= count <= max_records and 0 <= size <= MAX_BLOCK_BYTES):
            raise Corrupt(f"implausible block header at {position}: count={count}, size={size}")
        end = position + index + size + SYNC_SIZE
        if end > size_of_file:
            raise Truncated(f"the block at {position} runs past the end of the file")
        fileobj.seek(end - SYNC_SIZE)
        if fileobj.read(SYNC_SIZE) != header.sync:
            raise Corrupt(f"no sync marker after the block at {position}")
        blocks.append(BlockSpan(position, count, end))
        position = end
    return header, blocks


def records_in_blocks(fileobj: BinaryIO) -> int:
    """The records a container file's block headers state, summed without reading or
    decompressing the blocks' data (a seek past each one, its sync marker checked); the walk
    stops at the first block that is damaged or cut short. A hint (a progress line's total), not
    a check: the readers account for every record. Raises :class:`Corrupt` without a header."""
    header = read_header(ByteStream(fileobj, 4096))
    position, records = header.end, 0
    while True:
        fileobj.seek(position)
        stream = ByteStream(fileobj, 2 * 10)  # a block's record count and size: two longs
        try:
            count, size = stream.read_long(), stream.read_long()
        except Corrupt:
            return records
        if count < 0 or size < 0 or size > MAX_BLOCK_BYTES:
            return records
        end = position + stream.position + size
        fileobj.seek(end)
        if fileobj.read(SYNC_SIZE) != header.sync:
            return records
        records += count
        position = end + SYNC_SIZE


def header_bytes(schema: Any, codec: str, sync: bytes) -> bytes:
    """A container header: magic, metadata (compact schema JSON, codec), sync marker."""
    schema_text = json.dumps(schema_for_header(schema), separators=(",", ":")).encode()
    entries = ((b"avro.schema", schema_text), (b"avro.codec", codec.encode()))
    body = encode_long(len(entries)) + b"".join(
        encode_bytes(key) + encode_bytes(value) for key, value in entries
    )
    return MAGIC + body + encode_long(0) + sync


def frame_block(count: int, data: bytes, sync: bytes) -> bytes:
    """One block: record count, byte size, the (compressed) data, the sync marker."""
    return encode_long(count) + encode_long(len(data)) + data + sync


def check_codec(codec: str) -> str:
    """``codec`` if the writer can use it here; ``snappy`` needs the ``cramjam`` package."""
    if codec not in WRITER_CODECS:
        raise ValueError(f"unknown codec {codec!r}; use one of {', '.join(WRITER_CODECS)}")
    if codec == "snappy":
        try:
            import cramjam  # noqa: F401 (optional: only snappy needs it)
        except ImportError:
            raise ValueError(
                "codec 'snappy' needs the cramjam package, which is not installed; "
                "use deflate or null"
            ) from None
    return codec


def compress(codec: str, data: bytes, level: int = -1) -> bytes:
    if codec == "deflate":  # raw RFC 1951 stream, no zlib header
        compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        return compressor.compress(data) + compressor.flush()
    if codec == "snappy":  # Avro: raw snappy block + big-endian CRC32 of the uncompressed data
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data)) + struct.pack(">I", zlib.crc32(data))
    return data


def decompress(codec: str, data: bytes | memoryview) -> bytes | memoryview:
    """The records of a block; raises :class:`Corrupt` for bad data or an unknown codec."""
    try:
        if codec == "null":
            return data
        if codec == "deflate":
            inflater = _inflate.decompressobj(-15)
            out = inflater.decompress(data, MAX_DECOMPRESSED_BYTES)
            # Input left over, or output cut at the limit before the stream's end (ISA-L may
            # have taken all the input and hold the rest of the output).
            if inflater.unconsumed_tail or (
                len(out) >= MAX_DECOMPRESSED_BYTES and not inflater.eof
            ):
                raise Corrupt(f"block inflates to more than {MAX_DECOMPRESSED_BYTES} bytes")
            return out
        if codec == "snappy":
            import cramjam

            out = bytes(cramjam.snappy.decompress_raw(data[:-4]))
            if struct.unpack(">I", data[-4:])[0] != zlib.crc32(out):
                raise Corrupt("snappy block CRC32 mismatch")
            return out
        if codec == "bzip2":
            return _bounded(bz2.BZ2Decompressor(), data)
        if codec == "xz":
            return _bounded(lzma.LZMADecompressor(), data)
    except Corrupt:
        raise
    except Exception as error:  # noqa: BLE001 - any codec failure means corrupt data
        raise Corrupt(f"{codec} data does not decompress: {error}") from None
    raise Corrupt(f"unsupported codec {codec!r}")


def _bounded(decompressor: Any, data: bytes) -> bytes:
    out = decompressor.decompress(data, MAX_DECOMPRESSED_BYTES + 1)
    if len(out) > MAX_DECOMPRESSED_BYTES:
        raise Corrupt(f"block inflates to more than {MAX_DECOMPRESSED_BYTES} bytes")
    return out


def codec_available(codec: str) -> bool:
    """Whether blocks of ``codec`` can be decompressed here."""
    if codec == "snappy":
        try:
            import cramjam  # noqa: F401
        except ImportError:
            return False
    return codec in READER_CODECS


class ContainerWriter:
    """Appends pre-encoded records to an Avro object container file: the header when created,
    then blocks of at most about ``block_bytes`` (at least one record each). Codecs ``null``,
    ``deflate`` and ``snappy`` (with cramjam). The sync marker is an argument, so the same seed
    writes the same bytes."""

    def __init__(
        self,
        handle: BinaryIO,
        schema: Mapping[str, Any],
        codec: str = "deflate",
        sync_marker: bytes | None = None,
        compression_level: int = 6,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        check_codec(codec)
        if not -1 <= compression_level <= 9:
            raise ValueError(f"compression_level must be in [-1, 9], got {compression_level}")
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        self._handle = handle
        self._codec = codec
        self._level = compression_level
        self._block_bytes = block_bytes
        self._sync = sync_marker if sync_marker is not None else os.urandom(SYNC_SIZE)
        if len(self._sync) != SYNC_SIZE:
            raise ValueError("sync_marker must be 16 bytes")
        self.records_written = 0
        handle.write(header_bytes(schema, codec, self._sync))

    def write(self, records: Any) -> None:
        """Append records (an ``EncodedPayloads``: each one Avro datum of the file's schema)."""
        self.write_encoded(np.asarray(records.data), np.asarray(records.offsets))

    def write_encoded(self, data: np.ndarray, offsets: np.ndarray) -> None:
        """Append the records ``data[offsets[i]:offsets[i + 1]]`` in blocks."""
        n = offsets.size - 1
        first = 0
        while first < n:
            # The largest block that starts at `first` and stays under block_bytes (>= 1 record).
            limit = offsets[first] + self._block_bytes
            last = max(first + 1, int(np.searchsorted(offsets, limit, side="right")) - 1)
            last = min(last, n)
            block = compress(
                self._codec, data[offsets[first] : offsets[last]].tobytes(), self._level
            )
            self._handle.write(frame_block(last - first, block, self._sync))
            self.records_written += last - first
            first = last


def encode_container(
    schema: Mapping[str, Any],
    columns: Mapping[str, Any],
    rows: int,
    codec: str = "null",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    sync_marker: bytes | None = None,
) -> bytes:
    """A whole Avro container file for ``rows`` records given as columns (see
    :func:`schemas.avro.encode.encode_rows`), in blocks of about ``block_bytes``."""
    data, offsets = encode_rows(schema, columns, rows)
    return encode_encoded_container(schema, data, offsets, codec, block_bytes, sync_marker)


def encode_encoded_container(
    schema: Mapping[str, Any],
    data: np.ndarray,
    offsets: np.ndarray,
    codec: str = "null",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    sync_marker: bytes | None = None,
) -> bytes:
    """A whole Avro container file of the records ``data[offsets[i]:offsets[i + 1]]`` (each one
    Avro datum of ``schema``), in blocks of about ``block_bytes``."""
    sink = io.BytesIO()
    writer = ContainerWriter(sink, schema, codec, sync_marker, -1, block_bytes)
    writer.write_encoded(data, offsets)
    return sink.getvalue()
