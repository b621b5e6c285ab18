"""Avro binary of flat records -> Arrow columns, all records of many blocks at once.

A flat record schema has only fields of type int, long, float, double, string, bytes, enum or a
``[null, T]`` union of one of them (all of the project's message schemas; logical types already
stripped). A block holds its records back to back, each field encoded as in the Avro 1.11
specification, "Binary Encoding", so where a record starts depends on every byte before it.
Record starts are found in three vectorized steps:

1. a short walk from every block start (one record per step for all blocks at once) samples
   the first bytes records begin with;
2. every position whose first bytes match a sampled beginning is a candidate; the position
   after one record is computed for all candidates at once;
3. from each block start the chain "next record" is followed through the candidates by
   pointer doubling (log2 of the block's record count vectorized steps), unless the candidates
   that hold the leading fields every sampled record shares already form that chain (a release
   file's records, which share their crowd key: then they are the records), or do once the
   candidates that no block starts at and no candidate ends at are dropped (a few payload
   bytes that begin as records do: a report file's).

Then every field is decoded for all records at once and the result is checked exactly: each
record must end where the next one starts and each block where its last record ends (so a block
whose header understates or overstates its record count fails), every varint must fit in 10
bytes, every length and union branch must be valid, strings valid UTF-8. A group of blocks that
fails any check (or a candidate chain that breaks) gives None: the caller decodes it another way,
so the output never depends on a guess.

Where the extension ``esa_avro_blocks`` (``schemas/avro_blocks``, Rust, built by ``make venv``)
is installed, the records are instead walked one after another in compiled code, which makes the
same checks (its module documentation lists them) and gives the same columns; the steps above
are then the fallback of an installation without it (a remote worker installed from
``setup.py`` alone). ``benchmarks/bench_codecs.py`` times the reader on report and release
files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.avro.columns import arrow_type
from schemas.avro.varint import MAX_VARINT_BYTES as _MAX_VARINT_BYTES
from schemas.avro.varint import read_varints as _varints
from schemas.avro.varint import unzigzag as _signed
from schemas.avro.varint import varint_ends as _varint_ends
from schemas.avro.varint import words

try:  # the compiled walk over the records (schemas/avro_blocks); numpy without it
    import esa_avro_blocks as _native
except ImportError:  # pragma: no cover - an installation from setup.py alone
    _native = None

__all__ = ["FlatField", "flat_layout", "decode_flat_blocks"]

_FLAT_KINDS = ("int", "long", "float", "double", "string", "bytes")
_VARINT_KINDS = ("int", "long", "enum")
_FIXED_SIZES = {"float": 4, "double": 8}
_INT32_RANGE = (-(2**31), 2**31 - 1)
# Zero bytes after the data, so that short reads past its end need no bounds checks.
_PADDING = 16
# Largest group of blocks (decompressed bytes) decoded with numpy; larger ones go to fastavro.
_MAX_FAST_BYTES = 1 << 30
# Records sampled from the starts of the blocks (the first ones of every block, at most 16 per
# block), most distinct record beginnings used, and the most candidates per record before the
# sampled beginnings are judged too unselective.
_SAMPLED_RECORDS = 64
_SAMPLED_PER_BLOCK = 16
# Walks of at least this many steps per block go record by record in Python (_sample_beginnings).
_SCALAR_WALK_STEPS = 4
_UINT64 = (1 << 64) - 1
_MAX_BEGINNINGS = 16
_MAX_BEGINNING_BYTES = 4
_CANDIDATES_PER_RECORD = 1.25
# Longest field whose bytes are compared across records to decode it once (_constant_fields).
_CONSTANT_FIELD_BYTES = 64
# Longest strings and bytes gathered as rows of equal width (see _gather).
_ROW_GATHER_WIDTH = 64


@dataclass(frozen=True)
class FlatField:
    """One field of a flat record schema: its value kind (int, long, float, double, string,
    bytes, enum), its ``[null, T]`` union branches (-1 when not a union) and its Arrow type."""

    name: str
    kind: str
    value_branch: int
    null_branch: int
    symbols: tuple[str, ...]
    arrow_type: pa.DataType


def _flat_kind(avro_type: Any) -> tuple[str, tuple[str, ...]] | None:
    if isinstance(avro_type, str):
        return (avro_type, ()) if avro_type in _FLAT_KINDS else None
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind in _FLAT_KINDS:
            return kind, ()
        symbols = avro_type.get("symbols")
        if (
            kind == "enum"
            and isinstance(symbols, list)
            and all(isinstance(s, str) for s in symbols)
        ):
            return "enum", tuple(symbols)
    return None


def flat_layout(schema: Any) -> tuple[FlatField, ...] | None:
    """The fields of a record schema (logical types already stripped) whose fields are all
    int, long, float, double, string, bytes, enum or a ``[null, T]`` union of one of them;
    None for any other schema (those are read with fastavro)."""
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return None
    fields = []
    for avro_field in schema.get("fields", []):
        avro_type = avro_field["type"]
        value_branch = null_branch = -1
        if isinstance(avro_type, list):
            if len(avro_type) != 2 or avro_type.count("null") != 1:
                return None
            null_branch = avro_type.index("null")
            value_branch = 1 - null_branch
            avro_type = avro_type[value_branch]
        found = _flat_kind(avro_type)
        found_type = arrow_type(avro_field["type"])
        if found is None or found_type is None:
            return None
        kind, symbols = found
        fields.append(
            FlatField(avro_field["name"], kind, value_branch, null_branch, symbols, found_type)
        )
    return tuple(fields) or None


def _skip_value(kind: str, buf: np.ndarray, q: np.ndarray, limit: int) -> np.ndarray:
    """Position after a value of ``kind`` starting at ``q`` (garbage in, bounded garbage out)."""
    if kind in _VARINT_KINDS:
        return _varint_ends(buf, q)
    if kind in ("string", "bytes"):
        first = buf.take(q, mode="clip")
        zigzag = first.astype(np.int64)
        end = q + 1
        long_prefix = np.flatnonzero(first >= 0x80)
        if long_prefix.size:
            values, ends, _ = _varints(buf, q[long_prefix])
            zigzag[long_prefix] = np.minimum(values, np.uint64(2 * limit)).astype(np.int64)
            end[long_prefix] = ends
        # A negative length (odd zig-zag) cannot be a real record: send it past the data.
        return np.where(zigzag & 1, limit + 1, end + (zigzag >> 1))
    return q + _FIXED_SIZES[kind]


def _skip_record(fields: tuple[FlatField, ...], buf: np.ndarray, q: np.ndarray, limit: int):
    """Position after one record for records starting at ``q`` (int64, at most ``limit + 1``)."""
    q = q.astype(np.int64)
    for field in fields:
        if field.value_branch >= 0:
            branch = buf.take(q, mode="clip")
            after_branch = q + 1
            value_end = _skip_value(field.kind, buf, after_branch, limit)
            q = np.where(branch == 2 * field.value_branch, value_end, after_branch)
        else:
            q = _skip_value(field.kind, buf, q, limit)
        np.minimum(q, limit + 1, out=q)
    return q


def _varint_at(data: memoryview, last: int, position: int) -> tuple[int, int]:
    """(uint64 value, position after it) of the varint at ``position`` of ``data``, read to at
    most 10 bytes; bytes past ``last`` read as ``data[last]``."""
    current = data[position if position < last else last]
    if current < 0x80:  # one byte: most lengths and small ints
        return current, position + 1
    value, shift = current & 0x7F, 7
    for index in range(1, _MAX_VARINT_BYTES):
        at = position + index
        current = data[at if at < last else last]
        value |= (current & 0x7F) << shift
        shift += 7
        if current < 0x80:
            return value & _UINT64, at + 1
    return value & _UINT64, position + _MAX_VARINT_BYTES


def _skip_record_at(fields: tuple[FlatField, ...], data: memoryview, q: int, limit: int) -> int:
    """:func:`_skip_record` for one record starting at ``q``, with Python ints (the same
    position: bytes past ``data`` read as its last byte, varints read to at most 10 bytes)."""
    last = len(data) - 1
    cap = limit + 1
    for field in fields:
        if field.value_branch >= 0:
            branch = data[q if q < last else last]
            q += 1
            if branch != 2 * field.value_branch:
                q = q if q < cap else cap
                continue
        kind = field.kind
        if kind in _VARINT_KINDS:
            q = _varint_at(data, last, q)[1]
        elif kind in ("string", "bytes"):
            zigzag, end = _varint_at(data, last, q)
            if end > q + 1:  # as _skip_value: a longer length is capped at the data's size
                zigzag = min(zigzag, 2 * limit)
            q = cap if zigzag & 1 else end + (zigzag >> 1)
        else:
            q += _FIXED_SIZES[kind]
        q = q if q < cap else cap
    return q


def _sample_beginnings(
    fields: tuple[FlatField, ...], buf: np.ndarray, size: int, block_starts: np.ndarray, counts
) -> np.ndarray:
    """Starts of the first records of every block (a walk; unchecked, used only as guesses).

    A walk of many steps over few blocks (a batch of one big block: 16 steps) goes record by
    record in Python (about 10 µs a record), where each vectorized step over a handful of
    positions costs a few dozen numpy calls."""
    q = block_starts.astype(np.int64)
    per_block = min(_SAMPLED_PER_BLOCK, -(-_SAMPLED_RECORDS // q.size))
    remaining = np.minimum(counts, per_block)
    if per_block >= _SCALAR_WALK_STEPS:
        data = memoryview(buf)
        found_at: list[int] = []
        for start, steps in zip(q.tolist(), remaining.tolist(), strict=True):
            position = start
            for _ in range(steps):
                found_at.append(position)
                position = _skip_record_at(fields, data, position, size)
                if position > size:
                    break
        sample = np.array(found_at, dtype=np.int64)
        return sample[sample < size]
    found = []
    while q.size:
        keep = remaining > 0
        q, remaining = q[keep], remaining[keep]
        found.append(q)
        q = _skip_record(fields, buf, q, size)
        remaining = remaining - 1
    sample = np.concatenate(found)
    return sample[sample < size]


def _candidates(buf: np.ndarray, size: int, sample: np.ndarray, records: int) -> np.ndarray:
    """Positions whose first bytes equal the first bytes of some sampled record: the shortest
    beginning (1 to 4 bytes) that leaves few candidates per record, or the most selective."""
    firsts = np.unique(buf[sample])
    if firsts.size > _MAX_BEGINNINGS:
        return sample
    data = buf[:size]
    mask = data == firsts[0]
    for value in firsts[1:]:
        mask |= data == value
    candidates = np.flatnonzero(mask)
    if candidates.size <= _CANDIDATES_PER_RECORD * records:
        return candidates
    # The first 8 bytes at each position as one word (buf is padded: every word lies in it).
    candidate_codes = words(buf, candidates)[0]
    sample_codes = words(buf, sample)[0]
    for length in range(2, _MAX_BEGINNING_BYTES + 1):
        keep_bytes = np.uint64((1 << (8 * length)) - 1)
        known = np.unique(sample_codes & keep_bytes)
        if known.size > _MAX_BEGINNINGS:
            break
        masked = candidate_codes & keep_bytes
        keep = masked == known[0]
        for code in known[1:]:
            keep |= masked == code
        candidates, candidate_codes = candidates[keep], candidate_codes[keep]
        if candidates.size <= _CANDIDATES_PER_RECORD * records:
            break
    return candidates


def _pattern_chain(
    rest: tuple[FlatField, ...],
    buf: np.ndarray,
    size: int,
    block_starts: np.ndarray,
    counts: np.ndarray,
    holding: np.ndarray,
    pattern: np.ndarray,
) -> tuple[np.ndarray | None, np.ndarray]:
    """The records among ``holding`` (positions that hold the shared leading ``pattern``;
    ``rest``: the fields after it) if they, or those reached from a block's start, are the
    chain; None otherwise. Also where each holding position's record ends."""
    after = _skip_record(rest, buf, holding + pattern.size, size)
    if _is_chain(holding, after, block_starts, counts, size):
        return holding, after
    reached = _reached(holding, after, block_starts)
    if _is_chain(holding[reached], after[reached], block_starts, counts, size):
        return holding[reached], after
    return None, after


def _record_starts(
    fields: tuple[FlatField, ...],
    buf: np.ndarray,
    size: int,
    block_starts: np.ndarray,
    counts: np.ndarray,
    unproven: bool = False,
) -> tuple[np.ndarray, int, int, int, bool] | None:
    """Start of every record (blocks with records only), or None where the candidates do not
    hold a chain of ``count`` records from some block's start; with the number of leading
    fields and of their bytes that are the same in every record (0, 0 when none is known), the
    most leading fields that can be (all, unless a longer pattern proved one differs), and
    whether the starts are a guess: with ``unproven``, positions of a shared pattern as many
    as the records, one at each block's start, are taken without following them (decoding
    them proves or refutes them; see :func:`decode_flat_blocks`).

    The leading fields whose bytes all sampled records share (a release file's crowd key) are
    a pattern: candidates that hold it skip those fields in one step, the others field by
    field (the same positions either way). A pattern of 8 bytes or more is first looked for
    everywhere (:func:`_pattern_positions`), and where it lies is taken if it is the chain; if
    not, so is the pattern of fewer leading fields (records of several recipes share the
    window, not the recipe), as long as it is 8 bytes or more."""
    records = int(counts.sum())
    sample = np.unique(_sample_beginnings(fields, buf, size, block_starts, counts))
    shared, pattern, field_ends = _shared_fields(fields, buf, size, sample)
    # A release file's crowd key: where it lies are the records, usually. Records of several
    # recipes or channels share fewer leading fields than the sampled ones (the first records
    # of a file grouped by crowd): each shorter pattern of 8 bytes or more is tried in turn,
    # where it lies at least once per record. The shortest is looked for everywhere (one
    # pass), each longer one among the positions of the shortest.
    tried = [prefix for prefix in range(shared, 0, -1) if field_ends[prefix - 1] >= 8]
    shortest = field_ends[tried[-1] - 1] if tried else 0
    lying = _pattern_positions(buf, size, pattern[:shortest]) if tried else sample[:0]
    most = len(fields)
    for prefix in tried if lying.size >= records else ():  # fewer: no chain (_is_chain)
        prefix_bytes = field_ends[prefix - 1]
        holding = lying
        if prefix_bytes > shortest:
            holding = lying[_holds(buf, lying + shortest, pattern[shortest:prefix_bytes])]
        if holding.size < records:  # some record lacks these bytes: they are not all shared
            most = prefix - 1
            continue
        bound = most if most == prefix else len(fields)
        if unproven and holding.size == records:
            if np.array_equal(holding[np.cumsum(counts) - counts], block_starts):
                return holding, prefix, prefix_bytes, bound, True
        chain, _ = _pattern_chain(
            fields[prefix:], buf, size, block_starts, counts, holding, pattern[:prefix_bytes]
        )
        if chain is not None:  # every record holds the pattern of ``prefix`` fields
            return chain, prefix, prefix_bytes, bound, False
    candidates = _candidates(buf, size, sample, records)
    found = np.minimum(candidates.searchsorted(sample), candidates.size - 1)
    missing = sample[candidates[found] != sample] if candidates.size else sample
    if missing.size:
        candidates = np.sort(np.concatenate((candidates, missing)))
    matched = np.zeros(candidates.size, dtype=bool)
    if shared:
        matched = _holds(buf, candidates, pattern)
        holding = candidates[matched]
        chain, after = _pattern_chain(
            fields[shared:], buf, size, block_starts, counts, holding, pattern
        )
        if chain is not None:
            return chain, shared, pattern.size, len(fields), False
        following = np.empty(candidates.size, dtype=np.int64)
        following[matched] = after
        following[~matched] = _skip_record(fields, buf, candidates[~matched], size)
    else:
        following = _skip_record(fields, buf, candidates, size)
        reached = _reached(candidates, following, block_starts)
        if _is_chain(candidates[reached], following[reached], block_starts, counts, size):
            return candidates[reached], 0, 0, len(fields), False
    index = np.minimum(candidates.searchsorted(following), candidates.size - 1)
    missing = candidates.size  # the chain leaves the candidates: a node that maps to itself
    jump = np.append(np.where(candidates[index] == following, index, missing), missing)
    node = np.repeat(candidates.searchsorted(block_starts), counts)
    rank = np.arange(records) - np.repeat(np.cumsum(counts) - counts, counts)
    step = 1
    longest = int(counts.max())
    while step < longest:
        move = np.flatnonzero(rank & step)
        node[move] = jump[node[move]]
        step <<= 1
        if step < longest:
            jump = jump[jump]
    if np.any(node == missing):
        return None
    if shared and matched[node].all():
        return candidates[node], shared, pattern.size, len(fields), False
    return candidates[node], 0, 0, len(fields), False


def _is_chain(
    positions: np.ndarray, following: np.ndarray, block_starts: np.ndarray, counts, size: int
) -> bool:
    """Whether ascending ``positions`` (``following``: where the record at each ends) are the
    chain :func:`_record_starts` follows: ``counts[b]`` of them from block b's start on, each
    record ending where the next one starts and the last at the data's end. Then every block's
    chain stays inside ``positions`` (the common case: the candidates holding the shared
    pattern are exactly the records), and the pointer doubling would find the same starts."""
    records = int(counts.sum())
    if positions.size != records or records == 0:
        return False
    firsts = np.cumsum(counts) - counts
    return bool(
        np.array_equal(positions[firsts], block_starts)
        and np.array_equal(following[:-1], positions[1:])
        and int(following[-1]) == size
    )


def _reached(positions: np.ndarray, following: np.ndarray, block_starts: np.ndarray) -> np.ndarray:
    """Which of ascending ``positions`` are a block's start or where one of them ends
    (``following``): a stray candidate inside a record (a payload byte that happens to begin
    as records do) is rarely either, so dropping the others usually leaves the records alone,
    which :func:`_is_chain` then proves (a guess: nothing is dropped that the proof needs)."""
    targets = np.concatenate((following, block_starts))
    found = np.minimum(np.searchsorted(positions, targets), positions.size - 1)
    reached = np.zeros(positions.size, dtype=bool)
    reached[found[positions[found] == targets]] = True
    return reached


def _shared_fields(
    fields: tuple[FlatField, ...], buf: np.ndarray, size: int, sample: np.ndarray
) -> tuple[int, np.ndarray, list[int]]:
    """The leading fields (how many, and their bytes in the first sampled record) whose bytes
    every sampled record shares, at most _CONSTANT_FIELD_BYTES in all, and the bytes of the
    first 1, 2, ... of them; guesses (unchecked)."""
    if sample.size == 0:
        return 0, np.zeros(0, dtype=np.uint8), []
    begin = int(sample[0])
    end, field_ends = begin, []
    data = memoryview(buf)
    for field in fields:  # the first record's leading fields, where each one ends
        end = _skip_record_at((field,), data, end, size)
        if end > size or end - begin > _CONSTANT_FIELD_BYTES:
            break
        field_ends.append(end - begin)
    first = bytes(data[begin : begin + (field_ends[-1] if field_ends else 0)])
    for position in sample[1:].tolist():  # (a few dozen: bytes compared, no numpy per field)
        other = bytes(data[position : position + len(first)])
        while field_ends and other[: field_ends[-1]] != first[: field_ends[-1]]:
            field_ends.pop()
        if not field_ends:
            break
    shared_bytes = field_ends[-1] if field_ends else 0
    return len(field_ends), buf[begin : begin + shared_bytes].copy(), field_ends


def _pattern_positions(buf: np.ndarray, size: int, pattern: np.ndarray) -> np.ndarray:
    """Every position of the first ``size`` bytes of ``buf`` (padded with at least 8 bytes)
    where ``pattern`` (8 bytes or more) begins: its first 8 bytes compared as one word at every
    position (one pass, about as fast as finding one byte), the rest at the positions found."""
    word = np.ndarray(shape=(size,), dtype="<u8", buffer=buf, strides=(1,))
    positions = np.flatnonzero(word == pattern[:8].copy().view("<u8")[0])
    if pattern.size > 8 and positions.size:
        positions = positions[_holds(buf, positions + 8, pattern[8:])]
    return positions


def _holds(buf: np.ndarray, positions: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Whether ``buf`` holds ``pattern`` at each of ``positions`` (8 bytes per step)."""
    holds = np.ones(positions.size, dtype=bool)
    for offset in range(0, pattern.size, 8):
        piece = pattern[offset : offset + 8]
        found = words(buf, positions + offset)
        if found is None:
            return np.zeros(positions.size, dtype=bool)
        expected = np.zeros(8, dtype=np.uint8)
        expected[: piece.size] = piece
        keep = np.uint64((1 << (8 * piece.size)) - 1)
        holds &= found[1] & ((found[0] & keep) == expected.view("<u8")[0])
    return holds


# _PREFIX_MASKS[w][n]: which of w bytes are a value's first n (a look-up per row, not a compare
# per byte).
_PREFIX_MASKS = [np.arange(w) < np.arange(w + 1)[:, None] for w in range(_ROW_GATHER_WIDTH + 1)]


def _gather(buf: np.ndarray, begin: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, Any]:
    """Arrow offsets (int32) and the concatenated bytes ``buf[begin[i]:begin[i]+lengths[i]]``.

    Short values are gathered as rows of the longest one's width (one row copy each) and the
    bytes past each value's length dropped; long or very uneven ones through a byte index."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return offsets.astype(np.int32), pa.py_buffer(b"")
    width = int(lengths.max())
    if (
        width <= _ROW_GATHER_WIDTH
        and width * lengths.size <= 2 * total + 8 * lengths.size
        and int(begin.min()) >= 0
        and int(begin.max()) <= buf.size - width
    ):
        rows = np.lib.stride_tricks.as_strided(
            buf, shape=(buf.size - width + 1, width), strides=(1, 1)
        )
        values = rows[begin]
        if int(lengths.min()) < width:
            values = values[_PREFIX_MASKS[width][lengths]]
        return offsets.astype(np.int32), pa.py_buffer(values.reshape(-1))
    index = np.repeat(begin - offsets[:-1], lengths)
    index += np.arange(total, dtype=np.int64)
    return offsets.astype(np.int32), pa.py_buffer(buf.take(index))


def _is_ascii(data: Any) -> bool:
    """Whether every byte of ``data`` is below 0x80: ASCII, valid UTF-8 whatever the string
    boundaries (one pass over the bytes; Arrow's full check is several times slower)."""
    values = np.frombuffer(data, dtype=np.uint8)
    return not values.size or int(values.max()) < 0x80


def _fill(values: np.ndarray, present: np.ndarray | None) -> np.ndarray:
    if present is None:
        return values
    full = np.zeros(present.size, dtype=values.dtype)
    full[present] = values
    return full


def _decode_column(
    field: FlatField, buf: np.ndarray, q: np.ndarray, limit: np.ndarray
) -> tuple[pa.Array, np.ndarray] | None:
    """(Arrow array, end positions) of ``field`` for records where it starts at ``q``; None if
    some value is not valid Avro, passes ``limit`` (its block's end) or does not fit the
    Arrow type the fastavro path would give."""
    rows = q.size
    present = None
    if field.value_branch >= 0:
        zigzag, q, complete = _varints(buf, q)
        branch = _signed(zigzag)
        present = branch == field.value_branch
        if not complete or not np.all(present | (branch == field.null_branch)):
            return None
        if present.all():
            present = None
    sub_q = q if present is None else q[present]
    sub_limit = limit if present is None else limit[present]
    if field.kind in ("string", "bytes"):
        zigzag, begin, complete = _varints(buf, sub_q)
        lengths = _signed(zigzag)
        sub_end = begin + lengths
        if not complete or (lengths.size and (lengths.min() < 0 or np.any(sub_end > sub_limit))):
            return None
        if int(lengths.sum()) >= 2**31:  # Arrow string/binary offsets are int32
            return None
        offsets, data = _gather(buf, _fill(begin, present), _fill(lengths, present))
        array = _arrow_column(field, rows, present, data, offsets)
        if field.kind == "string" and not _is_ascii(data):
            try:
                array.validate(full=True)  # UTF-8, as fastavro checks it
            except pa.ArrowInvalid:
                return None
    elif field.kind in _VARINT_KINDS:
        zigzag, sub_end, complete = _varints(buf, sub_q)
        values = _signed(zigzag)
        if not complete:
            return None
        if values.size:
            low, high = int(values.min()), int(values.max())
            if field.kind == "int" and (low < _INT32_RANGE[0] or high > _INT32_RANGE[1]):
                return None
            if field.kind == "enum" and (low < 0 or high >= len(field.symbols)):
                return None
        array = _arrow_column(field, rows, present, _fill(values, present))
    else:
        width = _FIXED_SIZES[field.kind]
        sub_end = sub_q + width
        if np.any(sub_end > sub_limit):
            return None
        raw = buf.take(sub_q[:, None] + np.arange(width))
        values = raw.view("<f4" if field.kind == "float" else "<f8").reshape(-1)
        array = _arrow_column(field, rows, present, _fill(values, present))
    if present is None:
        return array, sub_end
    end = q.copy()
    end[present] = sub_end
    return array, end


def _arrow_column(
    field: FlatField,
    rows: int,
    present: np.ndarray | None,
    values: Any,
    offsets: Any = None,
) -> pa.Array:
    """``field``'s Arrow array of ``rows`` records, whichever path decoded them: ``values`` one
    number per record (0 where null), or for strings and bytes their bytes back to back with
    int32 ``offsets``; ``present``: where the value is not null (None: nowhere null)."""
    if field.kind in ("string", "bytes"):
        validity = (
            None if present is None else pa.py_buffer(np.packbits(present, bitorder="little"))
        )
        nulls = 0 if present is None else rows - int(np.count_nonzero(present))
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(values)]
        return pa.Array.from_buffers(field.arrow_type, rows, buffers, null_count=nulls)
    if field.kind == "enum":
        indices = pa.array(values, mask=_mask(present), type=pa.int64())
        return pa.array(field.symbols, type=pa.string()).take(indices)
    return pa.array(values, type=field.arrow_type, mask=_mask(present))


def _constant_fields(
    fields: tuple[FlatField, ...],
    buf: np.ndarray,
    starts: np.ndarray,
    limit: np.ndarray,
    known: tuple[int, int] = (0, 0),
) -> tuple[list[pa.Array], int]:
    """The leading fields whose bytes are the same in every record (a release file's crowd
    key, record after record), decoded once from the first record and repeated, and the bytes
    they take; ``known``: how many fields and bytes every record is known to share already
    (``_record_starts``), the rest compared here. Exact: equal bytes decode to equal values and
    end at equal offsets, the first record's are checked as any other's, and the caller still
    checks every record's end."""
    columns: list[pa.Array] = []
    offset = 0
    first = starts[:1]
    shared = known[0]
    for index, field in enumerate(fields):
        decoded = _decode_column(field, buf, first + offset, limit[:1])
        if decoded is None:
            break
        value, end = decoded
        length = int(end[0]) - int(first[0]) - offset
        begin = int(first[0]) + offset
        if index >= shared and (
            length > _CONSTANT_FIELD_BYTES
            or not _holds(buf, starts + offset, buf[begin : begin + length]).all()
        ):
            break
        columns.append(_repeated(value, starts.size))
        offset += length
    return columns, offset


def _repeated(value: pa.Array, rows: int) -> pa.Array:
    """The one value of ``value`` repeated ``rows`` times, as ``pa.repeat`` of its scalar gives
    it, built from numpy buffers where that is quicker (strings, bytes and numbers: ~0.01
    instead of ~0.08 ms for 20,000 rows)."""
    kind = value.type
    if value.null_count:
        return pa.nulls(rows, kind)
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        one = value[0].as_buffer().to_pybytes()
        if len(one) * rows < 2**31:
            offsets = np.arange(rows + 1, dtype=np.int32) * np.int32(len(one))
            return pa.Array.from_buffers(
                kind, rows, [None, pa.py_buffer(offsets), pa.py_buffer(one * rows)]
            )
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        numbers = value.to_numpy(zero_copy_only=False)
        return pa.array(np.repeat(numbers, rows), type=kind)
    return pa.repeat(value[0], rows)


def _mask(present: np.ndarray | None) -> np.ndarray | None:
    return None if present is None else ~present


def decode_flat_blocks(
    fields: tuple[FlatField, ...], contents: list[bytes], counts: list[int]
) -> pa.RecordBatch | None:
    """Decoded Avro blocks (``contents[i]`` holds ``counts[i]`` records of a flat record
    schema, see :func:`flat_layout`) as one Arrow RecordBatch, the same as fastavro's records
    through :func:`records_to_batch`; None when the bytes are not exactly that many valid
    records (the caller then decodes with fastavro, which finds the bad block)."""
    sizes = np.array([len(content) for content in contents], dtype=np.int64)
    count_array = np.asarray(counts, dtype=np.int64)
    records = int(count_array.sum())
    size = int(sizes.sum())
    if records == 0 or size + _PADDING >= _MAX_FAST_BYTES or np.any(count_array < 0):
        return None
    # Every record takes at least one byte per field: a count beyond that is not real (and
    # must not size any array).
    if np.any((count_array == 0) != (sizes == 0)) or np.any(count_array * len(fields) > sizes):
        return None
    if _native is not None:
        return _decode_natively(fields, contents, counts, records)
    buf = np.frombuffer(b"".join([*contents, bytes(_PADDING)]), dtype=np.uint8)
    block_ends = np.cumsum(sizes)
    nonempty = count_array > 0
    block_starts = (block_ends - sizes)[nonempty]
    block_ends = block_ends[nonempty]
    count_array = count_array[nonempty]
    # The likely starts (a shared pattern's positions) are decoded without following them
    # first: decoding checks every record's end, so if they decode they are the records; if
    # not, the starts are found as always and decoded again.
    found = _record_starts(fields, buf, size, block_starts, count_array, unproven=True)
    batch = None if found is None else _decode_records(fields, buf, found, block_ends, count_array)
    if batch is None and found is not None and found[4]:
        found = _record_starts(fields, buf, size, block_starts, count_array)
        if found is not None:
            batch = _decode_records(fields, buf, found, block_ends, count_array)
    return batch


def _decode_records(
    fields: tuple[FlatField, ...],
    buf: np.ndarray,
    found: tuple[np.ndarray, int, int, int, bool],
    block_ends: np.ndarray,
    counts: np.ndarray,
) -> pa.RecordBatch | None:
    """The records starting at ``found`` (:func:`_record_starts`) as a batch, or None unless
    every field decodes and each record ends where the next one starts (the last one of each
    block at the block's end): then the starts are the records, whether proven before or not."""
    starts, shared, shared_bytes, most, _ = found
    limit = np.repeat(block_ends, counts)
    columns, prefix = _constant_fields(fields[:most], buf, starts, limit, (shared, shared_bytes))
    if len(columns) < shared:  # the first record's shared fields do not decode
        return None
    q = starts + prefix
    for field in fields[len(columns) :]:
        decoded = _decode_column(field, buf, q, limit)
        if decoded is None:
            return None
        column, q = decoded
        columns.append(column)
    following = np.empty(starts.size, dtype=np.int64)
    following[:-1] = starts[1:]
    following[np.cumsum(counts) - 1] = block_ends
    if not np.array_equal(q, following):
        return None
    return pa.RecordBatch.from_arrays(columns, names=[field.name for field in fields])


# The kind codes of esa_avro_blocks.decode_blocks (schemas/avro_blocks/src/lib.rs), and the
# dtypes of its values that are not int64.
_NATIVE_KINDS = {"int": 0, "long": 1, "enum": 2, "float": 3, "double": 4, "string": 5, "bytes": 6}
_NATIVE_NUMBERS = {"float": "<f4", "double": "<f8"}


def _decode_natively(
    fields: tuple[FlatField, ...], contents: list[bytes], counts: list[int], records: int
) -> pa.RecordBatch | None:
    """:func:`decode_flat_blocks` by the compiled walk (``esa_avro_blocks``): the columns'
    buffers from it, wrapped as the numpy path wraps its own (:func:`_arrow_column`; None where
    it refuses)."""
    specs = [
        (_NATIVE_KINDS[field.kind], field.value_branch, field.null_branch, len(field.symbols))
        for field in fields
    ]
    sizes = [len(content) for content in contents]
    decoded = _native.decode_blocks(b"".join(contents), sizes, [int(n) for n in counts], specs)
    if decoded is None:
        return None
    columns = []
    for field, (values, offsets, present) in zip(fields, decoded, strict=True):
        if field.kind not in ("string", "bytes"):  # int64s (int, long, enum) or raw floats
            values = np.frombuffer(values, dtype=_NATIVE_NUMBERS.get(field.kind, "<i8"))
        if present is not None:  # one byte per record
            present = np.frombuffer(present, dtype=np.bool_)
        columns.append(_arrow_column(field, records, present, values, offsets))
    return pa.RecordBatch.from_arrays(columns, names=[field.name for field in fields])
