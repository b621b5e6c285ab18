"""CRC32C (Castagnoli) of many byte strings at once.

One table-driven CRC (RFC 3720, appendix B.4: reflected polynomial 0x82F63B78) runs over all
strings in parallel, one byte position per vectorized numpy step; the strings are sorted longest
first so the ones still running are a prefix. Once few strings remain, the native
``google_crc32c.extend`` finishes each of them. Single values: ``schemas.crc32c`` (native).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa

from schemas.avro.columns import binary_buffers

__all__ = ["crc32c_many"]


def _table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _table()
# Byte positions are processed for all strings at once while more than this many strings are
# that long; the rest of the (few) longer strings goes to the native CRC.
_VECTOR_MIN_ROWS = 32
# Strings longer than this go to the native CRC one by one (about 0.3 µs each, where a byte
# position at a time costs about 6 ns a byte and string).
_NATIVE_MIN_BYTES = 64


def _buffers(payloads: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(int64 offsets, uint8 data, validity mask or None) of any accepted input."""
    if hasattr(payloads, "offsets") and hasattr(payloads, "data"):  # schemas.payloads containers
        return np.asarray(payloads.offsets, dtype=np.int64), np.asarray(payloads.data), None
    if not isinstance(payloads, pa.Array | pa.ChunkedArray):
        payloads = pa.array(list(payloads), type=pa.large_binary())
    if isinstance(payloads, pa.ChunkedArray):
        payloads = (
            payloads.combine_chunks() if payloads.num_chunks else pa.array([], type=payloads.type)
        )
    offsets, data = binary_buffers(payloads)
    valid = None
    if payloads.null_count:
        valid = payloads.is_valid().to_numpy(zero_copy_only=False)
    return offsets, data, valid


def crc32c_many(payloads: pa.Array | pa.ChunkedArray | Sequence[bytes] | Any) -> np.ndarray:
    """CRC32C of every payload as unsigned 32-bit values in an int64 array (null -> -1).

    ``payloads``: an Arrow binary/string array (plain, large or chunked), a sequence of bytes
    (``None`` is null) or a ``schemas.payloads.EncodedPayloads`` buffer with offsets.
    """
    offsets, data, valid = _buffers(payloads)
    count = offsets.size - 1
    result = np.full(count, -1, dtype=np.int64)
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.diff(offsets)
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    # Stable, longest first; 16-bit keys where they fit (numpy sorts those by radix: 5x faster
    # on 50,000 payloads of mixed lengths, the same order).
    keys = -lengths.astype(np.int16) if int(lengths.max()) < 1 << 15 else -lengths
    order = np.argsort(keys, kind="stable")
    sorted_lengths = lengths[order]
    starts = offsets[:-1][order]
    # Long strings each go to the native CRC (for 20,000 sealed payloads of 99 bytes: 6 ms
    # against 13 ms one byte position at a time); they are a prefix of the sorted order.
    long_rows = int(np.count_nonzero(sorted_lengths > _NATIVE_MIN_BYTES))
    register = np.full(count, 0xFFFFFFFF, dtype=np.uint32)
    if long_rows:
        raw = data.tobytes()  # slices of bytes cost far less than numpy slices
        ends = starts[:long_rows] + sorted_lengths[:long_rows]
        register[:long_rows] = np.fromiter(
            (
                google_crc32c.value(raw[begin:end]) ^ 0xFFFFFFFF
                for begin, end in zip(starts[:long_rows].tolist(), ends.tolist(), strict=True)
            ),
            dtype=np.uint32,
            count=long_rows,
        )
    # still_running[j]: strings longer than j (a prefix of the sorted order), long ones aside.
    histogram = np.bincount(sorted_lengths, minlength=int(sorted_lengths[0]) + 1)
    still_running = count - np.cumsum(histogram) - long_rows
    vector_positions = int(np.count_nonzero(still_running > _VECTOR_MIN_ROWS))
    for position in range(vector_positions):
        running = long_rows + int(still_running[position])
        current = register[long_rows:running]
        byte = data[starts[long_rows:running] + position]
        register[long_rows:running] = _TABLE[(current ^ byte) & 0xFF] ^ (current >> 8)
    tail = int(still_running[vector_positions]) if vector_positions < still_running.size else 0
    for row in range(long_rows, long_rows + max(tail, 0)):
        begin = int(starts[row]) + vector_positions
        end = int(starts[row]) + int(sorted_lengths[row])
        register[row] = (
            google_crc32c.extend(int(register[row]) ^ 0xFFFFFFFF, data[begin:end].tobytes())
            ^ 0xFFFFFFFF
        )
    register ^= np.uint32(0xFFFFFFFF)
    result[order] = register
    if valid is not None:
        result[~valid] = -1
    return result
