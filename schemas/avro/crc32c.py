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
    # still_running[j]: strings longer than j (a prefix of the sorted order).
    histogram = np.bincount(sorted_lengths, minlength=int(sorted_lengths[0]) + 1)
    still_running = count - np.cumsum(histogram)
    vector_positions = int(np.count_nonzero(still_running > _VECTOR_MIN_ROWS))
    register = np.full(count, 0xFFFFFFFF, dtype=np.uint32)
    for position in range(vector_positions):
        running = int(still_running[position])
        current = register[:running]
        byte = data[starts[:running] + position]
        register[:running] = _TABLE[(current ^ byte) & 0xFF] ^ (current >> 8)
    register ^= np.uint32(0xFFFFFFFF)
    tail = int(still_running[vector_positions]) if vector_positions < still_running.size else 0
    for row in range(tail):
        begin = int(starts[row]) + vector_positions
        end = int(starts[row]) + int(sorted_lengths[row])
        register[row] = google_crc32c.extend(int(register[row]), data[begin:end].tobytes())
    result[order] = register
    if valid is not None:
        result[~valid] = -1
    return result
