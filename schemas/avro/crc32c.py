"""CRC32C (Castagnoli) of many byte strings at once.

Strings all of one length L of at most :data:`_LINEAR_MAX_LENGTH` bytes, back to back (fixed-size
payloads): a CRC is linear over GF(2), so the CRC of an L-byte string m is the CRC of L zero
bytes XOR the XOR over its bytes of ``T_d[m_j]``, the register a lone byte leaves after
``d = L - 1 - j`` more zero bytes (from a zero register): one table look-up and one XOR per byte,
a column of the strings' matrix (a view of the buffer) at a time. Otherwise: one table-driven CRC
(RFC 3720, appendix B.4: reflected polynomial 0x82F63B78) runs over all of them in parallel, one
byte position per vectorized numpy step, longest first so the ones still running are a prefix;
once few remain, the native ``google_crc32c.extend`` finishes each; strings longer than
:data:`_NATIVE_MIN_BYTES` go to the native CRC one by one from the start. Single values:
``schemas.crc32c`` (native).

Where the compiled module ``esa_avro_blocks`` (``schemas/avro_blocks``) is installed, strings
without nulls go to its ``crc32c_many`` instead, one call for all of them: 10,000,000 payloads of
16 bytes are a few nanoseconds each there, about 85 ns each by the table look-ups above. The
numpy paths stay for an installation from ``setup.py`` alone, and the tests run both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa

from schemas.avro.columns import binary_buffers, packed_binary

try:  # the compiled CRCs (schemas/avro_blocks); numpy without it
    from esa_avro_blocks import crc32c_many as _native_crc32c_many
except ImportError:  # pragma: no cover - an installation from setup.py alone
    _native_crc32c_many = None

__all__ = ["crc32c_many"]


def _table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _table()
# Strings of one length up to this long take the linear path; its tables are built when first
# needed (128 KB). Longer ones are faster through the native CRC one by one (50,000 strings of
# 200 bytes: 41 ms linear, 19 ms native; of 99 bytes: 22 ms linear, 26 ms native).
_LINEAR_MAX_LENGTH = 128
# Bytes of strings transposed at a time (to stay in cache).
_TRANSPOSED_BYTES = 1 << 19


def _linear_tables() -> tuple[np.ndarray, np.ndarray]:
    """``(tables, zeros)``: ``tables[d, b]`` the register byte ``b`` leaves after ``d``
    zero bytes (from a zero register), ``zeros[L]`` the CRC32C of L zero bytes."""
    tables = np.empty((_LINEAR_MAX_LENGTH, 256), dtype=np.uint32)
    tables[0] = _TABLE
    for distance in range(1, _LINEAR_MAX_LENGTH):
        previous = tables[distance - 1]
        tables[distance] = _TABLE[previous & 0xFF] ^ (previous >> 8)
    zeros = np.empty(_LINEAR_MAX_LENGTH + 1, dtype=np.uint32)
    register = 0xFFFFFFFF
    for length in range(_LINEAR_MAX_LENGTH + 1):
        zeros[length] = register ^ 0xFFFFFFFF
        register = int(_TABLE[register & 0xFF]) ^ (register >> 8)
    return tables, zeros


_LINEAR: tuple[np.ndarray, np.ndarray] | None = None


def _crc_equal_lengths(matrix: np.ndarray) -> np.ndarray:
    """CRC32C (uint32) of each row of a (strings x L) uint8 matrix (see the module docstring):
    one table look-up and one XOR per byte, a column at a time."""
    global _LINEAR
    if _LINEAR is None:
        _LINEAR = _linear_tables()
    tables, zeros = _LINEAR
    count, width = matrix.shape
    result = np.full(count, zeros[width], dtype=np.uint32)
    step = max(1, _TRANSPOSED_BYTES // width)
    for first in range(0, count, step):
        # Columns of a block of rows made contiguous (one copy) before the look-ups.
        columns = np.ascontiguousarray(matrix[first : first + step].T)
        part = result[first : first + step]
        for column in range(width):
            part ^= tables[width - 1 - column][columns[column]]
    return result


def _crc_by_position(starts: np.ndarray, lengths: np.ndarray, data: np.ndarray) -> np.ndarray:
    """CRC32C (uint32) of the strings ``data[starts[i]:starts[i] + lengths[i]]``: one byte
    position of all still-running strings per numpy step, the last few strings natively."""
    count = lengths.size
    result = np.empty(count, dtype=np.uint32)
    # Stable, longest first; 16-bit keys where they fit (numpy sorts those by radix: 5x faster
    # on 50,000 payloads of mixed lengths, the same order).
    keys = -lengths.astype(np.int16) if int(lengths.max()) < 1 << 15 else -lengths
    order = np.argsort(keys, kind="stable")
    sorted_lengths = lengths[order]
    starts = starts[order]
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
    return result


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
    if valid is None and _native_crc32c_many is not None:
        computed = _native_crc32c_many(*packed_binary(offsets, data))
        if computed is not None:
            result[:] = np.frombuffer(computed, dtype="<u4")
            return result
    lengths = np.diff(offsets)
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    width = int(lengths[0])
    if (
        valid is None
        and 0 < width <= _LINEAR_MAX_LENGTH
        and int(offsets[-1] - offsets[0]) == width * count
        and bool((lengths == width).all())
    ):  # strings of one length back to back (fixed-size payloads): a matrix view, no gather
        begin = int(offsets[0])
        result[:] = _crc_equal_lengths(data[begin : begin + width * count].reshape(count, width))
    else:
        result[:] = _crc_by_position(offsets[:-1], lengths, data)
    if valid is not None:
        result[~valid] = -1
    return result
