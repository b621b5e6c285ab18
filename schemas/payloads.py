"""Vectorized Avro codec for message payloads (``schemas/payloads.avsc``).

Every payload is the Avro binary encoding of one record of ``payloads.avsc`` whose first field is
an ``int`` kind tag, followed by int/long fields; Avro encodes each of them as a zigzag varint
(Avro 1.11 specification, "Binary Encoding"), so a payload is a short sequence of varints. Tag 0
(``CENSUS``) is retired: devices once sent content-free census payloads the analyzer counted as
respondents (one device could inflate n); they now send presence messages with an empty payload,
which the shuffler counts and never releases. The decoder still recognizes tag 0 so the analyzer
can dead-letter such payloads (``census_not_counted``) instead of counting them.

The codec works on whole arrays: :func:`encode_payloads` writes all payloads of a batch into one
``uint8`` buffer plus offsets (:class:`EncodedPayloads`), and :func:`decode_payloads` parses the
concatenation of many payloads with vectorized varint arithmetic. Nothing loops over messages in
Python. Decoding never raises on bad bytes: each payload gets a validity flag and a reason code
(:data:`DECODE_REASONS`). Only canonical encodings are accepted (shortest varint form, exactly the
bytes the encoder would write), so a payload's bytes are a function of its values and cannot carry
a side channel in their encoding.

CRC32C of many payloads at once: :func:`schemas.avro.crc32c.crc32c_many`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from schemas import schema_json
from schemas.avro.columns import binary_buffers
from schemas.avro.varint import varint_lengths, zigzag

__all__ = [
    "PAYLOAD_SCHEMA",
    "CENSUS",
    "PAYLOAD_KINDS",
    "KIND_NAMES",
    "PayloadLayout",
    "LAYOUTS",
    "DECODE_REASONS",
    "EncodedPayloads",
    "DecodedPayloads",
    "payload_kind_tag",
    "payload_record_schema",
    "encode_payloads",
    "encode_message_batch",
    "decode_payloads",
    "message_columns",
    "payload_limits",
    "encode_randomized",
    "decode_for",
]

PAYLOAD_SCHEMA = "payloads"

# Kind tags: part of the wire format, never renumbered (a new kind takes a new number). Tag 0
# (census) is retired and never encoded by devices; it stays known so it is never reused.
CENSUS = "census"
PAYLOAD_KINDS: Mapping[str, int] = MappingProxyType(
    {
        CENSUS: 0,
        "bucket": 1,
        "sketch": 2,
        "signed_bucket": 3,
        "fragment_bucket": 4,
        "tree_node": 5,
    }
)
KIND_NAMES: tuple[str, ...] = tuple(sorted(PAYLOAD_KINDS, key=PAYLOAD_KINDS.__getitem__))
_RECORD_NAMES = {
    CENSUS: "esa.CensusPayload",
    "bucket": "esa.BucketPayload",
    "sketch": "esa.SketchPayload",
    "signed_bucket": "esa.SignedBucketPayload",
    "fragment_bucket": "esa.FragmentBucketPayload",
    "tree_node": "esa.TreeNodePayload",
}
# Fields whose values must be >= 0 (indices) and fields that hold a sign (+1 or -1).
_INDEX_FIELDS = frozenset({"bucket", "row", "column", "fragment", "period", "node"})
_SIGN_FIELDS = frozenset({"sign"})

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_MAX_VARINT_BYTES = 10


@dataclass(frozen=True)
class PayloadLayout:
    """The fields of one payload kind after the tag, in wire order, with their Avro types."""

    kind: str
    tag: int
    record_name: str
    fields: tuple[tuple[str, str], ...]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)


def _load_layouts() -> dict[str, PayloadLayout]:
    """Read the layouts from payloads.avsc so that schema and codec cannot drift apart."""
    records = {
        f"{record.get('namespace', '')}.{record['name']}": record
        for record in schema_json(PAYLOAD_SCHEMA)
    }
    layouts = {}
    for kind, record_name in _RECORD_NAMES.items():
        record = records[record_name]
        fields = [(f["name"], f["type"]) for f in record["fields"]]
        if fields[0] != ("kind", "int"):
            raise ValueError(f"{record_name}: first field must be the int kind tag")
        for name, avro_type in fields[1:]:
            if avro_type not in ("int", "long"):
                raise ValueError(f"{record_name}.{name}: only int/long fields are supported")
        layouts[kind] = PayloadLayout(kind, PAYLOAD_KINDS[kind], record_name, tuple(fields[1:]))
    return layouts


LAYOUTS: Mapping[str, PayloadLayout] = MappingProxyType(_load_layouts())
_LAYOUT_BY_TAG = tuple(LAYOUTS[name] for name in KIND_NAMES)
_ALL_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(name for layout in _LAYOUT_BY_TAG for name in layout.field_names)
)

DECODE_REASONS: tuple[str, ...] = (
    "ok",
    "empty",  # zero bytes (or a null entry)
    "truncated_varint",  # the payload ends inside a varint (continuation bit on its last byte)
    "overlong_varint",  # a varint longer than 10 bytes or above 64 bits
    "non_canonical_varint",  # a varint with redundant trailing zero groups
    "unknown_kind",  # the tag names no payload kind
    "unexpected_kind",  # a known kind the caller did not allow (e.g. bucket in a sketch crowd)
    "missing_fields",  # the record ends before all its fields
    "trailing_bytes",  # bytes after the last field of the record
    "int_out_of_range",  # an Avro int field outside the 32-bit range
    "value_out_of_range",  # negative index, sign not +-1, or an index above a caller's limit
)
_REASON = {name: code for code, name in enumerate(DECODE_REASONS)}


def payload_kind_tag(kind: str | int) -> int:
    """The wire tag of a payload kind given by name or tag."""
    if isinstance(kind, str):
        if kind not in PAYLOAD_KINDS:
            raise ValueError(f"unknown payload kind {kind!r}; known: {list(PAYLOAD_KINDS)}")
        return PAYLOAD_KINDS[kind]
    if isinstance(kind, int | np.integer) and 0 <= int(kind) < len(KIND_NAMES):
        return int(kind)
    raise ValueError(f"unknown payload kind {kind!r}; known: {list(PAYLOAD_KINDS)}")


def payload_record_schema(kind: str | int) -> dict[str, Any]:
    """The fastavro-parsed record schema of one payload kind (for per-record reference codecs)."""
    name = _RECORD_NAMES[KIND_NAMES[payload_kind_tag(kind)]]
    for record in schema_json(PAYLOAD_SCHEMA):
        if f"{record['namespace']}.{record['name']}" == name:
            return fastavro.parse_schema(record)
    raise ValueError(f"{name} missing from {PAYLOAD_SCHEMA}.avsc")


# ---------------------------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedPayloads:
    """Many payloads as one byte buffer: payload i is ``data[offsets[i]:offsets[i + 1]]``."""

    data: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        data = np.ascontiguousarray(self.data, dtype=np.uint8)
        offsets = np.ascontiguousarray(self.offsets, dtype=np.int64)
        if data.ndim != 1 or offsets.ndim != 1 or offsets.size < 1:
            raise ValueError("EncodedPayloads: data and offsets must be 1-D, offsets non-empty")
        if offsets[0] != 0 or offsets[-1] != data.size or np.any(np.diff(offsets) < 0):
            raise ValueError("EncodedPayloads.offsets must rise from 0 to len(data)")
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "offsets", offsets)

    def __len__(self) -> int:
        return self.offsets.size - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def to_list(self) -> list[bytes]:
        """The payloads as Python ``bytes`` (one slice of one buffer each)."""
        return self.to_arrow().to_pylist()

    def to_arrow(self) -> pa.Array:
        """A zero-copy ``pyarrow.large_binary`` array over the same memory."""
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(),
            len(self),
            [None, pa.py_buffer(self.offsets), pa.py_buffer(self.data)],
        )

    @classmethod
    def from_list(cls, payloads: Sequence[bytes]) -> EncodedPayloads:
        """Concatenate Python ``bytes`` payloads (``None`` counts as an empty payload)."""
        try:  # pyarrow copies a list of bytes into one buffer about 5x faster than join + len
            return cls.from_arrow(pa.array(payloads, type=pa.large_binary()))
        except (pa.ArrowException, TypeError):
            pass
        items = [b"" if p is None else bytes(p) for p in payloads]
        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.frombuffer(b"".join(items), dtype=np.uint8), offsets)

    @classmethod
    def from_arrow(cls, array: pa.Array | pa.ChunkedArray) -> EncodedPayloads:
        """From a pyarrow binary or large_binary array (nulls become empty payloads)."""
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
        if pa.types.is_binary(array.type):
            array = array.cast(pa.large_binary())
        if not pa.types.is_large_binary(array.type):
            raise ValueError(f"expected a binary array, got {array.type}")
        if array.null_count:
            array = array.fill_null(b"")
        offsets, data = binary_buffers(array)
        start, stop = int(offsets[0]), int(offsets[-1])
        return cls(data[start:stop], offsets - start)

    @classmethod
    def coerce(cls, payloads: EncodedPayloads | Sequence[bytes] | pa.Array) -> EncodedPayloads:
        if isinstance(payloads, EncodedPayloads):
            return payloads
        if isinstance(payloads, pa.Array | pa.ChunkedArray):
            return cls.from_arrow(payloads)
        return cls.from_list(payloads)


@dataclass(frozen=True)
class DecodedPayloads:
    """Decoded payload columns. Rows with ``valid`` False hold zeros; ``reason`` says why."""

    kind: np.ndarray  # int8 tag per payload, -1 where the tag could not be read
    columns: Mapping[str, np.ndarray]  # int64 per field name; 0 where the kind lacks the field
    valid: np.ndarray  # bool
    reason: np.ndarray  # uint8 index into DECODE_REASONS

    def __len__(self) -> int:
        return self.valid.size

    def reason_names(self) -> np.ndarray:
        """Reason codes as strings ("ok" for valid payloads)."""
        return np.asarray(DECODE_REASONS, dtype=object)[self.reason]

    def reason_counts(self) -> dict[str, int]:
        counts = np.bincount(self.reason, minlength=len(DECODE_REASONS))
        return {DECODE_REASONS[i]: int(c) for i, c in enumerate(counts) if c}

    def is_kind(self, kind: str | int) -> np.ndarray:
        """Mask of valid payloads of one kind."""
        return self.valid & (self.kind == payload_kind_tag(kind))


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def _as_int64_column(values: Any, name: str, size: int | None) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"field {name!r} must be a 1-D array")
    if array.size and not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise ValueError(f"field {name!r} must hold integers, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"field {name!r} has values above the Avro long range")
    if size is not None and array.size != size:
        raise ValueError(f"field {name!r} has {array.size} values, expected {size}")
    return array.astype(np.int64, copy=False)


def encode_payloads(
    kind: str | int, fields: Mapping[str, Any], count: int | None = None
) -> EncodedPayloads:
    """Avro binary payloads of one kind from field arrays (names as in ``payloads.avsc``).

    ``count`` is needed only for a kind without fields (the retired census tag).
    """
    layout = _LAYOUT_BY_TAG[payload_kind_tag(kind)]
    missing = set(layout.field_names) - set(fields)
    extra = set(fields) - set(layout.field_names)
    if missing or extra:
        raise ValueError(
            f"{layout.kind} payload fields are {list(layout.field_names)}; "
            f"missing {sorted(missing)}, unexpected {sorted(extra)}"
        )
    if not layout.fields:
        if count is None or count < 0:
            raise ValueError(f"{layout.kind} payloads need count >= 0")
        size = count
    else:
        size = count if count is not None else np.asarray(fields[layout.field_names[0]]).size
    columns = [np.full(size, layout.tag, dtype=np.int64)]
    for name, avro_type in layout.fields:
        column = _as_int64_column(fields[name], name, size)
        if (
            avro_type == "int"
            and column.size
            and (column.min() < _INT32_MIN or column.max() > _INT32_MAX)
        ):
            raise ValueError(f"field {name!r} is an Avro int: values must fit in 32 bits")
        columns.append(column)
    zigzagged = [zigzag(column) for column in columns]
    lengths = [varint_lengths(z) for z in zigzagged]
    offsets = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.sum(lengths, axis=0), out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    field_start = offsets[:-1].copy()
    for z, n_bytes in zip(zigzagged, lengths, strict=True):
        for j in range(int(n_bytes.max(initial=0))):
            has_byte = n_bytes > j
            group = ((z[has_byte] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
            more = (n_bytes[has_byte] > j + 1).astype(np.uint8) << 7
            data[field_start[has_byte] + j] = group | more
        field_start += n_bytes
    return EncodedPayloads(data, offsets)


def _message_fields(batch: Any, payload_kind: str) -> dict[str, np.ndarray]:
    """Payload fields from a ``privacy.messages.MessageBatch``."""
    if payload_kind == "bucket":
        return {"bucket": batch.bucket}
    if payload_kind == "signed_bucket":
        return {"bucket": batch.bucket, "sign": batch.sign}
    if payload_kind == "fragment_bucket":
        return {"fragment": batch.fragment, "bucket": batch.bucket}
    if payload_kind == "tree_node":
        return {"period": batch.period, "node": batch.bucket, "sign": batch.sign}
    raise ValueError(f"no MessageBatch mapping for payload kind {payload_kind!r}")


def encode_message_batch(
    batch: Any, payload_kind: str, sketch_width: int | None = None
) -> EncodedPayloads:
    """Payloads for a ``privacy.messages.MessageBatch`` of a randomizer with ``payload_kind``.

    Sketch messages carry ``bucket = row * sketch_width + column`` in the batch.
    """
    if payload_kind == "sketch":
        if sketch_width is None or sketch_width < 1:
            raise ValueError("sketch payloads need sketch_width (columns per sketch row)")
        bucket = np.asarray(batch.bucket, dtype=np.int64)
        fields = {"row": bucket // sketch_width, "column": bucket % sketch_width}
    else:
        fields = _message_fields(batch, payload_kind)
    return encode_payloads(payload_kind, fields, count=len(np.asarray(batch.bucket)))


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------

_FIELD_COUNTS = np.array([len(layout.fields) for layout in _LAYOUT_BY_TAG], dtype=np.int64)


def decode_payloads(
    payloads: EncodedPayloads | Sequence[bytes] | pa.Array,
    allowed_kinds: Iterable[str | int] | None = None,
    limits: Mapping[str, int] | None = None,
    check_values: bool = True,
) -> DecodedPayloads:
    """Decode many payloads at once; bad payloads are flagged, never raised.

    ``allowed_kinds``: kinds accepted (others get ``unexpected_kind``); default all.
    ``limits``: exclusive upper bounds per field, e.g. ``{"bucket": domain_size}``.
    ``check_values``: flag negative indices and signs other than +-1 (``value_out_of_range``);
    False decodes whatever the Avro types allow.
    """
    encoded = EncodedPayloads.coerce(payloads)
    n = len(encoded)
    data, offsets = encoded.data, encoded.offsets
    lengths = encoded.lengths
    reason = np.zeros(n, dtype=np.uint8)
    kind = np.full(n, -1, dtype=np.int8)
    columns = {name: np.zeros(n, dtype=np.int64) for name in _ALL_FIELDS}

    def flag(mask: np.ndarray, name: str) -> None:
        if mask.any():  # (most batches have nothing to flag: one pass instead of three)
            reason[(reason == 0) & mask] = _REASON[name]

    flag(lengths == 0, "empty")
    if data.size == 0:
        return DecodedPayloads(kind, MappingProxyType(columns), reason == 0, reason)

    nonempty = lengths > 0
    continuation = data >= 0x80
    is_end = ~continuation
    last_bytes = offsets[1:][nonempty] - 1
    is_end[last_bytes] = True  # a varint never crosses a payload boundary
    ends = np.flatnonzero(is_end)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    varint_length = ends - starts + 1

    # Varints of payload i are first_varint[i] .. first_varint[i] + varints_per_payload[i] - 1.
    ends_before = np.zeros(data.size + 1, dtype=np.int64)  # varint ends strictly before a byte
    np.cumsum(is_end, out=ends_before[1:])
    first_varint = ends_before[offsets[:-1]]
    varints_per_payload = ends_before[offsets[1:]] - first_varint

    # Value of every varint: its 7-bit groups, least significant first (at most 10 are read).
    longest = min(int(varint_length.max()), _MAX_VARINT_BYTES)
    zigzagged = (data[starts] & 0x7F).astype(np.uint64)
    for j in range(1, longest):
        longer = np.flatnonzero(varint_length > j)
        group = (data[starts[longer] + j] & 0x7F).astype(np.uint64)
        zigzagged[longer] |= group << np.uint64(7 * j)
    values = (zigzagged >> np.uint64(1)).view(np.int64) ^ -(zigzagged & np.uint64(1)).view(np.int64)

    if longest > 1 or continuation[ends].any():
        last_byte = data[ends]
        varint_reasons = (
            ("truncated_varint", continuation[ends]),
            (
                "overlong_varint",
                (varint_length > _MAX_VARINT_BYTES)
                | ((varint_length == _MAX_VARINT_BYTES) & (last_byte > 1)),
            ),
            ("non_canonical_varint", (varint_length > 1) & (last_byte == 0)),
        )
        for name, bad in varint_reasons:
            if bad.any():
                bad_through = np.zeros(bad.size + 1, dtype=np.int64)
                np.cumsum(bad, out=bad_through[1:])
                count = bad_through[first_varint + varints_per_payload] - bad_through[first_varint]
                flag(count > 0, name)

    readable = (reason == 0) & nonempty
    tag = np.zeros(n, dtype=np.int64)
    tag[readable] = values[first_varint[readable]]
    known = (tag >= 0) & (tag < len(_LAYOUT_BY_TAG))
    flag(readable & ~known, "unknown_kind")
    kind[readable & known] = tag[readable & known]
    if allowed_kinds is not None:
        allowed = np.zeros(len(_LAYOUT_BY_TAG), dtype=bool)
        allowed[[payload_kind_tag(k) for k in allowed_kinds]] = True
        flag(readable & known & ~allowed[np.clip(tag, 0, len(allowed) - 1)], "unexpected_kind")
    expected = 1 + _FIELD_COUNTS[np.clip(tag, 0, len(_FIELD_COUNTS) - 1)]
    flag(readable & known & (varints_per_payload < expected), "missing_fields")
    flag(readable & known & (varints_per_payload > expected), "trailing_bytes")

    out_of_int = np.zeros(n, dtype=bool)
    out_of_domain = np.zeros(n, dtype=bool)
    limits = dict(limits or {})
    unknown_limits = set(limits) - set(_ALL_FIELDS)
    if unknown_limits:
        raise ValueError(f"limits name unknown payload fields {sorted(unknown_limits)}")
    good = reason == 0
    present = np.flatnonzero(np.bincount(kind[good] + 1, minlength=len(_LAYOUT_BY_TAG) + 1)[1:])
    for layout in _LAYOUT_BY_TAG:
        if layout.tag not in present:
            continue
        rows = np.flatnonzero(good & (kind == layout.tag))
        for position_in_record, (name, avro_type) in enumerate(layout.fields, start=1):
            field_values = values[first_varint[rows] + position_in_record]
            columns[name][rows] = field_values
            if avro_type == "int":
                out_of_int[rows] |= (field_values < _INT32_MIN) | (field_values > _INT32_MAX)
            if name in limits:
                out_of_domain[rows] |= field_values >= limits[name]
            if check_values and name in _INDEX_FIELDS:
                out_of_domain[rows] |= field_values < 0
            if check_values and name in _SIGN_FIELDS:
                out_of_domain[rows] |= (field_values != 1) & (field_values != -1)
    flag(out_of_int, "int_out_of_range")
    flag(out_of_domain, "value_out_of_range")

    valid = reason == 0
    if not valid.all():
        kind[~valid] = -1
        for column in columns.values():
            column[~valid] = 0
    return DecodedPayloads(kind, MappingProxyType(columns), valid, reason)


def message_columns(
    decoded: DecodedPayloads, payload_kind: str, sketch_width: int | None = None
) -> dict[str, np.ndarray]:
    """The valid payloads of ``payload_kind`` as ``MessageBatch``-style columns
    (bucket, sign, fragment, period); the inverse of :func:`encode_message_batch`."""
    rows = decoded.is_kind(payload_kind)
    # Only the kind's own fields (the others are 0 in its rows).
    names = LAYOUTS[payload_kind].field_names if payload_kind in LAYOUTS else decoded.columns
    take = {name: decoded.columns[name][rows] for name in names}
    for name, dtype in (("fragment", np.int16), ("period", np.int32)):
        if name in take and take[name].size and take[name].max() > np.iinfo(dtype).max:
            raise ValueError(
                f"{name} exceeds {np.dtype(dtype).name}: decode with limits={{{name!r}: ...}}"
            )
    count = int(rows.sum())
    ones = np.ones(count, dtype=np.int8)
    zeros16, zeros32 = np.zeros(count, dtype=np.int16), np.zeros(count, dtype=np.int32)
    if payload_kind == "bucket":
        return {"bucket": take["bucket"], "sign": ones, "fragment": zeros16, "period": zeros32}
    if payload_kind == "signed_bucket":
        sign = take["sign"].astype(np.int8)
        return {"bucket": take["bucket"], "sign": sign, "fragment": zeros16, "period": zeros32}
    if payload_kind == "fragment_bucket":
        fragment = take["fragment"].astype(np.int16)
        return {"bucket": take["bucket"], "sign": ones, "fragment": fragment, "period": zeros32}
    if payload_kind == "tree_node":
        return {
            "bucket": take["node"],
            "sign": take["sign"].astype(np.int8),
            "fragment": zeros16,
            "period": take["period"].astype(np.int32),
        }
    if payload_kind == "sketch":
        if sketch_width is None or sketch_width < 1:
            raise ValueError("sketch payloads need sketch_width (columns per sketch row)")
        bucket = take["row"] * sketch_width + take["column"]
        return {"bucket": bucket, "sign": ones, "fragment": zeros16, "period": zeros32}
    raise ValueError(f"no MessageBatch mapping for payload kind {payload_kind!r}")


def payload_limits(randomizer: Any) -> dict[str, int]:
    """Exclusive upper bounds of every payload field for ``randomizer`` (a
    ``privacy.randomizers`` object): what :func:`decode_payloads` should enforce for its crowds."""
    kind = randomizer.payload_kind
    if kind == "sketch":
        return {"row": randomizer.num_hashes, "column": randomizer.width}
    limits = {"bucket": randomizer.message_domain_size}
    if kind == "fragment_bucket":
        limits["fragment"] = randomizer.fragments + 1  # fragments are numbered 1..tau
    if kind == "tree_node":
        limits = {"node": randomizer.message_domain_size, "period": randomizer.periods + 1}
    return limits


def encode_randomized(batch: Any, randomizer: Any) -> EncodedPayloads:
    """Payloads of a ``MessageBatch`` made by ``randomizer``."""
    return encode_message_batch(batch, randomizer.payload_kind, getattr(randomizer, "width", None))


def decode_for(
    randomizer: Any, payloads: EncodedPayloads | Sequence[bytes] | pa.Array
) -> DecodedPayloads:
    """Decode a crowd of ``randomizer``: its own payload kind only, fields in range."""
    return decode_payloads(
        payloads, allowed_kinds=(randomizer.payload_kind,), limits=payload_limits(randomizer)
    )
