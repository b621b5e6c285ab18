"""Avro ``int``/``long`` as zig-zag varints, one value or whole arrays at once.

Avro 1.11 specification, "Binary Encoding": an int or long is zig-zag mapped
(``(n << 1) ^ (n >> 63)``, so small magnitudes of either sign are small) and written as a
little-endian base-128 varint, seven bits per byte, the high bit set on every byte but the last;
a long takes at most 10 bytes. Lengths of strings, bytes, blocks and maps are longs too.

The array functions never loop over values in Python: encoding builds an ``(n, width)`` byte
matrix one column per byte position; decoding reads the varints that start at an array of
positions as 8-byte little-endian words (one gather), finds each one's last byte from the
words' high bits and packs the 7-bit groups with three shift-and-mask steps (when every one is a
single byte, as short lengths and small ints are, the first bytes are the values); the few varints
longer than 8 bytes (or positions too near the end of the buffer) are read one byte position per
vectorized step.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "MAX_VARINT_BYTES",
    "encode_long",
    "encode_bytes",
    "zigzag",
    "varint_lengths",
    "varint_matrix",
    "varint_segments",
    "read_varints",
    "unzigzag",
    "varint_ends",
    "words",
]

MAX_VARINT_BYTES = 10
_THRESHOLDS = np.array([1 << (7 * j) for j in range(1, MAX_VARINT_BYTES)], dtype=np.uint64)


def encode_long(value: int) -> bytes:
    """One Avro ``long`` (or ``int``): the zig-zag varint of ``value``."""
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_bytes(value: str | bytes) -> bytes:
    """One Avro ``bytes`` or ``string``: its length as a long, then the (UTF-8) bytes."""
    data = value.encode() if isinstance(value, str) else bytes(value)
    return encode_long(len(data)) + data


def zigzag(values: np.ndarray) -> np.ndarray:
    """Zig-zag mapped int64 values as uint64."""
    values = np.asarray(values).astype(np.int64, copy=False)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def varint_lengths(zigzagged: np.ndarray) -> np.ndarray:
    """Bytes of each unsigned varint: 1 + the number of 7-bit groups above the first."""
    return 1 + np.searchsorted(_THRESHOLDS, zigzagged, side="right").astype(np.int64)


def varint_matrix(zigzagged: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Unsigned varints as an ``(n, max length)`` byte matrix (zero padding after each one)."""
    width = int(lengths.max(initial=1))
    matrix = np.zeros((zigzagged.size, width), dtype=np.uint8)
    for j in range(width):
        group = ((zigzagged >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        matrix[:, j] = group | ((lengths > j + 1).astype(np.uint8) << 7)
    return matrix


def varint_segments(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Avro longs of int64 ``values``: (bytes per value, all varints one after another)."""
    zigzagged = zigzag(values)
    lengths = varint_lengths(zigzagged)
    matrix = varint_matrix(zigzagged, lengths)
    keep = np.arange(matrix.shape[1]) < lengths[:, None]
    return lengths, matrix[keep]


_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
_BYTE_SUM = np.uint64(0x0101010101010101)
# Packing the 7-bit groups of a word: (keep mask, moved mask, shift) per step.
_PACK = tuple(
    (np.uint64(keep), np.uint64(moved), np.uint64(shift))
    for keep, moved, shift in (
        (0x007F007F007F007F, 0x7F007F007F007F00, 1),
        (0x00003FFF00003FFF, 0x3FFF00003FFF0000, 2),
        (0x000000000FFFFFFF, 0x0FFFFFFF00000000, 4),
    )
)


def words(buf: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The 8 bytes at each position ``q`` of ``buf`` as little-endian uint64 words (a gather
    from an unaligned uint64 view of ``buf`` one byte apart), and whether each word lies
    within ``buf`` (the others are garbage); None when ``buf`` is too short or some position
    negative."""
    last = buf.size - 8
    if q.size == 0 or last < 0 or int(q.min()) < 0:
        return None
    overlapping = np.ndarray(shape=(last + 1,), dtype="<u8", buffer=buf, strides=(1,))
    return overlapping[np.minimum(q, last)], q <= last


def _word_varints(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, bytes, whether a varint ends within the word) of the varints at words' starts."""
    ends = ~words & _HIGH_BITS  # the high bit clear: a varint's last byte
    lowest = ends & (~ends + np.uint64(1))
    keep = (lowest << np.uint64(1)) - np.uint64(1)  # bytes up to the last one (all when 8)
    value = words & keep & _LOW_BITS
    for kept, moved, shift in _PACK:
        value = (value & kept) | ((value & moved) >> shift)
    lengths = (((keep & _HIGH_BITS) >> np.uint64(7)) * _BYTE_SUM) >> np.uint64(56)
    return value, lengths.astype(np.int64), ends != 0


def read_varints(buf: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Varints starting at positions ``q`` of ``buf`` (reads past the end are clipped; callers
    pad): (uint64 zig-zag values, end positions, whether all of them end within 10 bytes)."""
    q = np.asarray(q, dtype=np.int64)
    first = buf.take(q, mode="clip")
    if not first.size or int(first.max()) < 0x80:  # one byte each (short lengths, small ints)
        return first.astype(np.uint64), q + 1, True
    found = words(buf, q)
    if found is not None:
        gathered, inside = found
        value, lengths, ended = _word_varints(gathered)
        end = q + lengths
        ended &= inside
        if ended.all():
            return value, end, True
        longer = np.flatnonzero(~ended)
        value[longer], end[longer], complete = _read_varints_bytewise(buf, q[longer])
        return value, end, complete
    return _read_varints_bytewise(buf, q)


def _read_varints_bytewise(buf: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """:func:`read_varints` one byte position per vectorized step."""
    first = buf.take(q, mode="clip")
    value = (first & 0x7F).astype(np.uint64)
    more = first >= 0x80
    end = q + 1
    for index in range(1, MAX_VARINT_BYTES):
        if not more.any():
            return value, end, True
        end += more
        group = buf.take(q + index, mode="clip")
        shifted = (group & 0x7F).astype(np.uint64) << np.uint64(7 * index)
        shifted[~more] = 0
        value |= shifted
        more &= group >= 0x80
    return value, end, not more.any()


def unzigzag(zigzagged: np.ndarray) -> np.ndarray:
    """Signed int64 values of zig-zag mapped uint64 values."""
    return (zigzagged >> np.uint64(1)).astype(np.int64) ^ -(zigzagged & np.uint64(1)).astype(
        np.int64
    )


def varint_ends(buf: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Position after the varint starting at each of ``q`` (at most 10 bytes read)."""
    q = np.asarray(q, dtype=np.int64)
    first = buf.take(q, mode="clip")
    if not (first >= 0x80).any():
        return q + 1
    found = words(buf, q)
    if found is not None:
        gathered, inside = found
        ends = ~gathered & _HIGH_BITS
        lowest = ends & (~ends + np.uint64(1))
        keep = (lowest << np.uint64(1)) - np.uint64(1)
        lengths = (((keep & _HIGH_BITS) >> np.uint64(7)) * _BYTE_SUM) >> np.uint64(56)
        end = q + lengths.astype(np.int64)
        longer = np.flatnonzero((ends == 0) | ~inside)
        if longer.size:
            end[longer] = _varint_ends_bytewise(buf, q[longer])
        return end
    return _varint_ends_bytewise(buf, q)


def _varint_ends_bytewise(buf: np.ndarray, q: np.ndarray) -> np.ndarray:
    """:func:`varint_ends` one byte position per vectorized step."""
    more = buf.take(q, mode="clip") >= 0x80
    end = q + 1
    for index in range(1, MAX_VARINT_BYTES):
        if not more.any():
            break
        end += more
        more &= buf.take(q + index, mode="clip") >= 0x80
    return end
