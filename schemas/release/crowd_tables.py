"""Crowd tables of an ``esa-release/2`` release: reading them (a few at a time) and checking them, one at a time.

A shuffler release states per crowd its status and counts in ``crowds/<stem>.avro`` tables
(``released_crowd.avsc``), one per bucket of a window and instance (``schemas/release/crowd_buckets.py``),
never in the commit record: the record commits each table by size, record count and SHA-256
like a message file and states the totals (``crowds_released``, ``crowds_withheld``,
``respondents_released``, ``records_released``).

:func:`check_crowd_table` is what ``schemas.release.commit.verify_release`` applies to each committed
table (bounded memory: a few tables at a time, never a set of all crowds): each row's window start
and instance are its stem's (and the commit's instance when it states one), its crowd hashes to
the stem's bucket (:func:`~schemas.release.crowd_buckets.crowd_bucket`), the rows are strictly in
:func:`~schemas.release.crowd_buckets.crowd_order` (so no crowd is listed twice: a crowd can only be in
its bucket's table), ``window_end > window_start``, a released crowd states an int
``respondents_released`` in [0, 1e10] and at least the ``crowd_threshold``, a withheld one states
none and no messages, and the table's ``messages_released`` add up to its stem's message files'
records. :class:`CrowdTotals` adds the tables up for the commit's totals.

Readers (the analyzer, ``esa train``) take the crowds with :func:`iter_crowds` (one table in
memory at a time) or :func:`read_crowd_table`; each row is a dict with exactly the keys of
:data:`CROWD_FIELDS` (the keys the ``esa-release/1`` commit record's crowds had, plus
``instance``).

Pure: the standard library, fastavro and ``schemas.avro`` (numpy, Arrow).
"""

from __future__ import annotations

import datetime
import functools
import io
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import parsed_schema, schema_json
from schemas.avro import container
from schemas.avro.decode import decode_flat_blocks, flat_layout
from schemas.avro.schema import strip_logical_types
from schemas.regular_files import open_regular
from schemas.release.crowd_buckets import (
    CROWDS_DIR,
    MAX_CROWD_BUCKETS,
    BucketKey,
    crowd_bucket,
    crowd_order,
    key_json_buckets,
)

if TYPE_CHECKING:
    from schemas.release.commit import FileEntry

__all__ = [
    "CROWD_FIELDS",
    "MAX_RESPONDENTS_RELEASED",
    "ReleaseError",
    "CommittedRelease",
    "CrowdColumns",
    "CrowdTotals",
    "crowd_table_buckets",
    "crowd_table_paths",
    "read_crowd_table",
    "parse_crowd_table",
    "parse_crowd_tables",
    "parse_crowd_table_columns",
    "iter_crowds",
    "check_crowd_table",
    "describe_crowd",
]

CROWD_FIELDS = (
    "window_start_ms",
    "window_end_ms",
    "instance",
    "channel",
    "recipe_id",
    "crowd_id",
    "status",
    "respondents_released",
    "messages_released",
)
RELEASED_CROWD = "released_crowd"
# No crowd is larger than the accountant accepts (privacy/accounting/variation_ratio.py,
# MAX_RESPONDENTS), so an absurd n is refused before any privacy computation.
MAX_RESPONDENTS_RELEASED = 10**10
_STATUSES = ("released", "withheld")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)


class ReleaseError(ValueError):
    """A directory that is not a complete, unaltered release; the message names the file."""


class CommittedRelease(Protocol):
    """What the readers need of a verified release (``schemas.release.commit.VerifiedRelease``, or the
    analyzer's ``Release``): its directory and its commit entries."""

    @property
    def path(self) -> str: ...

    @property
    def entries(self) -> Sequence[FileEntry]: ...


def _ms(value: Any) -> int:
    """Milliseconds since the epoch of a timestamp-millis value (fastavro gives datetimes)."""
    if isinstance(value, datetime.datetime):
        return (value - _EPOCH) // _MS
    return int(value)


def _without_parse_keys(schema: Any) -> Any:
    """A fastavro-parsed schema without fastavro's own bookkeeping keys (``__fastavro_parsed``,
    ``__named_schemas``), for comparing a file's writer schema with ours."""
    if isinstance(schema, dict):
        return {k: _without_parse_keys(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_without_parse_keys(item) for item in schema]
    return schema


_RELEASED_CROWD_SCHEMA: list[Any] = []


def _released_crowd_schema() -> Any:
    """``released_crowd.avsc`` parsed, as :func:`_without_parse_keys` gives it (made once)."""
    if not _RELEASED_CROWD_SCHEMA:
        _RELEASED_CROWD_SCHEMA.append(_without_parse_keys(parsed_schema(RELEASED_CROWD)))
    return _RELEASED_CROWD_SCHEMA[0]


def parse_crowd_table(source: BinaryIO | bytes, name: str) -> list[dict[str, Any]]:
    """The rows of a crowd table held in ``source`` (bytes or a binary file) as crowd dicts;
    ReleaseError naming ``name`` when it is not an Avro file of ReleasedCrowd records."""
    handle = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    try:
        start = handle.tell()
        reader = fastavro.reader(handle)
        if _without_parse_keys(reader.writer_schema) != _released_crowd_schema():
            # Another writer schema: resolved against ReleasedCrowd record by record (slow; a
            # schema that does not resolve is refused). The shuffler's own is read as written.
            handle.seek(start)
            reader = fastavro.reader(handle, reader_schema=parsed_schema(RELEASED_CROWD))
        ms = _ms
        return [
            {
                "window_start_ms": ms(row["window_start"]),
                "window_end_ms": ms(row["window_end"]),
                "instance": row["instance"],
                "channel": row["channel"],
                "recipe_id": row["recipe_id"],
                "crowd_id": row["crowd_id"],
                "status": row["status"],
                "respondents_released": row["respondents_released"],
                "messages_released": row["messages_released"],
            }
            for row in reader
        ]
    except Exception as error:  # noqa: BLE001 - any decoding failure is one refusal line
        detail = " ".join(str(error).split())[:160]
        raise ReleaseError(
            f"{name}: not a crowd table (Avro file of ReleasedCrowd records): "
            f"{type(error).__name__}: {detail}"
        ) from None


@functools.cache
def _table_layout() -> tuple[Any, ...] | None:
    """The flat layout of ReleasedCrowd (``schemas.avro.decode``), made once."""
    return flat_layout(strip_logical_types(schema_json(RELEASED_CROWD)))


def _block_contents(data: bytes) -> tuple[list[Any], list[int]]:
    """The decompressed blocks of an Avro container file and their record counts
    (``container.walk_blocks``: raises unless the file is nothing but whole blocks)."""
    header, blocks = container.walk_blocks(io.BytesIO(data), container.MAX_DECOMPRESSED_BYTES)
    contents, counts = [], []
    for block in blocks:
        stream = container.ByteStream(io.BytesIO(data[block.offset : block.offset + 20]), 20)
        stream.read_long()
        size = stream.read_long()
        begin = block.offset + stream.position
        if begin + size + container.SYNC_SIZE != block.end:
            raise container.Corrupt(f"block at {block.offset}: size {size} does not fit")
        contents.append(container.decompress(header.codec, memoryview(data)[begin : begin + size]))
        counts.append(block.count)
    return contents, counts


class CrowdColumns(Sequence[dict[str, Any]]):
    """One crowd table's rows as Arrow columns named as :data:`CROWD_FIELDS` (window bounds in
    ms): a sequence of the crowd dicts :func:`parse_crowd_table` gives, made only when a row is
    asked for (:meth:`rows`), so that checks and counts can work on whole columns."""

    __slots__ = ("table", "_rows")

    def __init__(self, table: pa.RecordBatch | pa.Table) -> None:
        self.table = table
        self._rows: list[dict[str, Any]] | None = None

    def column(self, name: str) -> pa.Array:
        """The column ``name`` (one of :data:`CROWD_FIELDS`) as one Arrow array."""
        column = self.table.column(name)
        if isinstance(column, pa.ChunkedArray):
            return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        return column

    def values(self, name: str) -> list[Any]:
        """The column ``name`` as Python values (what the row dicts hold)."""
        return self.column(name).to_pylist()

    def count_by(self, names: Sequence[str]) -> dict[tuple, int]:
        """Rows per distinct values of the columns ``names`` (Python values, as in the rows):
        the columns' values zipped and counted, no dict per row."""
        return dict(Counter(zip(*(self.values(name) for name in names), strict=True)))

    def rows(self) -> list[dict[str, Any]]:
        """The crowd dicts (made once)."""
        if self._rows is None:
            columns = [self.values(name) for name in CROWD_FIELDS]
            self._rows = [
                {
                    "window_start_ms": start,
                    "window_end_ms": end,
                    "instance": instance,
                    "channel": channel,
                    "recipe_id": recipe_id,
                    "crowd_id": crowd_id,
                    "status": status,
                    "respondents_released": respondents,
                    "messages_released": messages,
                }
                for start, end, instance, channel, recipe_id, crowd_id, status, respondents, messages in zip(
                    *columns, strict=True
                )
            ]
        return self._rows

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: Any) -> Any:
        return self.rows()[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CrowdColumns):
            return self.table.equals(other.table) or self.rows() == other.rows()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self.rows() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CrowdColumns({len(self)} crowds)"


def parse_crowd_table_columns(sources: Sequence[tuple[bytes, str]]) -> list[CrowdColumns] | None:
    """The rows of several crowd tables (``(bytes, name)`` each) as :class:`CrowdColumns`, all
    decoded at once as Arrow columns (``schemas.avro.decode.decode_flat_blocks``, every record
    checked exactly; numpy's cost is per call, so one call for many small tables); None when any
    table is not in the shuffler's own schema or does not decode that way: the caller then
    reads them one by one with :func:`parse_crowd_table`, which says what is wrong."""
    layout = _table_layout()
    contents: list[Any] = []
    counts: list[int] = []
    per_table: list[int] = []
    try:
        for data, _ in sources:
            writer = fastavro.reader(io.BytesIO(data)).writer_schema
            if _without_parse_keys(writer) != _released_crowd_schema():
                return None
            table_contents, table_counts = _block_contents(data)
            contents += table_contents
            counts += table_counts
            per_table.append(sum(table_counts))
        batch = decode_flat_blocks(layout, contents, counts) if layout and contents else None
    except Exception:  # noqa: BLE001 - whatever is wrong, the one-table reader says it
        return None
    if batch is None or batch.num_rows != sum(per_table):
        return None
    batch = pa.RecordBatch.from_arrays(
        [batch.column(field) for field in _TABLE_FIELDS], names=list(CROWD_FIELDS)
    )
    out, first = [], 0
    for records in per_table:
        out.append(CrowdColumns(batch.slice(first, records)))
        first += records
    return out


def parse_crowd_tables(sources: Sequence[tuple[bytes, str]]) -> list[list[dict[str, Any]]] | None:
    """The rows of several crowd tables (``(bytes, name)`` each) as :func:`parse_crowd_table`
    gives them: :func:`parse_crowd_table_columns`' rows (None where it gives None)."""
    tables = parse_crowd_table_columns(sources)
    return None if tables is None else [table.rows() for table in tables]


# ReleasedCrowd's fields in the order of :data:`CROWD_FIELDS` (its window timestamps are named
# without the ``_ms``; they hold milliseconds).
_TABLE_FIELDS = tuple(
    name.removesuffix("_ms") if name.startswith("window_") else name for name in CROWD_FIELDS
)


def read_crowd_table(path: str) -> list[dict[str, Any]]:
    """The crowds of the crowd table at ``path`` (dicts with the keys of :data:`CROWD_FIELDS`,
    in the table's order). Call it on a table of a verified release: it is not checked here."""
    try:
        with open_regular(path, "rb") as handle:
            return parse_crowd_table(handle, path)
    except OSError as error:
        raise ReleaseError(f"{path}: unreadable crowd table: {error}") from None


def crowd_table_paths(release: CommittedRelease) -> list[str]:
    """The committed crowd tables of a verified release (paths joined with its directory, in
    commit order)."""
    return [
        os.path.join(release.path, *entry.path.split("/"))
        for entry in release.entries
        if entry.path.startswith(CROWDS_DIR + "/")
    ]


def iter_crowds(release: CommittedRelease) -> Iterator[dict[str, Any]]:
    """Every crowd of a verified release, table after table (one table in memory at a time)."""
    for path in crowd_table_paths(release):
        yield from read_crowd_table(path)


def describe_crowd(crowd: Mapping[str, Any]) -> str:
    """A crowd's key as one line of JSON (for error messages)."""
    return json.dumps(
        {key: crowd.get(key) for key in ("window_start_ms", "channel", "recipe_id", "crowd_id")},
        ensure_ascii=False,
    )[:300]


@dataclass
class CrowdTotals:
    """Sums over crowd tables, compared with the commit record's totals."""

    released: int = 0
    withheld: int = 0
    respondents: int = 0
    messages: int = 0

    def add(self, other: CrowdTotals) -> None:
        self.released += other.released
        self.withheld += other.withheld
        self.respondents += other.respondents
        self.messages += other.messages

    def problem(self, commit: Mapping[str, Any]) -> str | None:
        """What disagrees with the commit record's totals, or None."""
        for field, value in (
            ("crowds_released", self.released),
            ("crowds_withheld", self.withheld),
            ("respondents_released", self.respondents),
            ("records_released", self.messages),
        ):
            if commit.get(field) != value:
                return f"{field} {commit.get(field)!r}, its crowd tables sum to {value}"
        return None


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _row_problem(
    row: Mapping[str, Any], key: BucketKey, buckets: int, threshold: Any, instance: int | None
) -> str | None:
    start, end = row["window_start_ms"], row["window_end_ms"]
    if start != key.window_start:
        return f"has window_start {start}, its table's window starts at {key.window_start}"
    if end <= start:
        return f"has window_end {end} <= window_start {start}"
    if row["instance"] != key.instance:
        return f"has instance {row['instance']}, its table is instance {key.instance}'s"
    if instance is not None and row["instance"] != instance:
        return f"has instance {row['instance']}, the commit record states {instance}"
    bucket = crowd_bucket(row["channel"], row["recipe_id"], row["crowd_id"], buckets)
    if bucket != key.bucket:
        return f"belongs in bucket {bucket}, not in bucket {key.bucket}'s table"
    respondents, messages = row["respondents_released"], row["messages_released"]
    if row["status"] not in _STATUSES:
        return f"has status {row['status']!r}"
    if row["status"] == "withheld":
        if respondents is not None or messages != 0:
            return "is withheld but states counts"
        return None
    if not _int_in(respondents, 0, MAX_RESPONDENTS_RELEASED):
        return (
            f"has respondents_released {respondents!r}, not an int in "
            f"[0, {MAX_RESPONDENTS_RELEASED:.0e}]"
        )
    if isinstance(threshold, int) and respondents < threshold:
        return f"is released with {respondents} respondents, below the crowd_threshold {threshold}"
    if messages < 0:
        return f"has messages_released {messages} < 0"
    return None


# The fields crowd_bucket hashes.
CROWD_KEY_FIELDS = ("channel", "recipe_id", "crowd_id")
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _has_escaped(column: pa.Array) -> bool:
    """Whether some string of ``column`` may hold a character JSON escapes: any byte below
    0x20, ``\\`` or ``"`` in its data buffer (a sliced column's whole buffer: more is only
    safer)."""
    data = column.buffers()[2] if len(column) else None
    if data is None:
        return False
    raw = np.frombuffer(data, dtype=np.uint8)
    return bool(((raw < 0x20) | (raw == 0x5C) | (raw == 0x22)).any())


def crowd_table_buckets(crowds: CrowdColumns, buckets: int) -> np.ndarray:
    """Every crowd's :func:`~schemas.release.crowd_buckets.crowd_bucket` (int64): its key's JSON
    joined by Arrow, each distinct key hashed once, in one loop (``crowd_bucket`` per crowd when
    a key has a character JSON escapes)."""
    channel, recipe_id, crowd_id = (crowds.column(name) for name in CROWD_KEY_FIELDS)
    if len(crowds) == 0:
        return np.zeros(0, dtype=np.int64)
    plain = (
        type(buckets) is int
        and 1 <= buckets <= MAX_CROWD_BUCKETS
        and not channel.null_count
        and not recipe_id.null_count
        and not any(_has_escaped(column) for column in (channel, recipe_id, crowd_id))
    )
    if not plain:
        keys = zip(channel.to_pylist(), recipe_id.to_pylist(), crowd_id.to_pylist(), strict=True)
        return np.array([crowd_bucket(*key, buckets) for key in keys], dtype=np.int64)
    quoted = pc.binary_join_element_wise('"', crowd_id, '"', "")
    last = pc.if_else(pc.is_null(crowd_id), pa.scalar("null"), quoted)
    joined = pc.binary_join_element_wise('["', channel, '","', recipe_id, '",', last, "]", "")
    distinct = pc.unique(joined)  # a crowd is in every window's table: hashed once
    hashed = joined if len(distinct) == len(joined) else distinct
    of_hashed = np.array(
        key_json_buckets(hashed.cast(pa.binary()).to_pylist(), buckets), dtype=np.int64
    )
    if hashed is joined:
        return of_hashed
    return of_hashed[pc.index_in(joined, distinct).to_numpy(zero_copy_only=False)]


def _crowd_order_rises(crowds: CrowdColumns) -> np.ndarray:
    """Per row after the first, whether its :func:`~schemas.release.crowd_buckets.crowd_order`
    is above the row before's, compared column by column (Arrow compares strings by their UTF-8
    bytes: code point order, Python's, as decoded strings are valid UTF-8)."""
    rows = len(crowds)
    if rows < 2:
        return np.ones(0, dtype=bool)
    crowd_id = crowds.column("crowd_id")
    parts = [
        crowds.column("channel"),
        crowds.column("recipe_id"),
        pc.cast(pc.is_valid(crowd_id), pa.int8()),
        pc.fill_null(crowd_id, ""),
    ]
    above = None  # row i + 1 above row i on the parts compared so far, from the last one back
    for part in reversed(parts):
        before, after = part.slice(0, rows - 1), part.slice(1)
        greater = pc.greater(after, before)
        above = (
            greater if above is None else pc.or_(greater, pc.and_(pc.equal(after, before), above))
        )
    return pc.fill_null(above, False).to_numpy(zero_copy_only=False)


def _int64(value: Any) -> bool:
    return type(value) is int and _INT64[0] <= value <= _INT64[1]


def crowd_table_totals(
    tables: Sequence[CrowdColumns],
    keys: Sequence[BucketKey],
    parameters: Mapping[str, Any],
    instance: Any,
) -> list[CrowdTotals | None]:
    """Per table (its stem ``key``), its totals when none of its rows :func:`check_crowd_table`
    would refuse, checked column by column over all the tables at once; None for a table some
    row of which may be refused (or for all when a parameter is not a plain int): that table is
    then checked row by row, which says what is wrong. ``parameters`` and ``instance``: the
    commit's."""
    buckets, threshold = parameters.get("crowd_buckets"), parameters.get("crowd_threshold")
    lengths = np.array([len(table) for table in tables], dtype=np.int64)
    rows = int(lengths.sum())
    plain = (
        all(_int64(part) for key in keys for part in key)
        and (instance is None or _int64(instance))
        and (not isinstance(threshold, int) or _int64(threshold))
        and type(buckets) is int
        and 1 <= buckets <= MAX_CROWD_BUCKETS
        and rows < (1 << 63) // (MAX_RESPONDENTS_RELEASED + 1)
    )
    if not plain:
        return [None] * len(tables)
    if rows == 0:
        return [CrowdTotals() for _ in tables]
    batches = [t.table for t in tables if isinstance(t.table, pa.RecordBatch)]
    if len(batches) == len(tables):
        crowds = CrowdColumns(pa.Table.from_batches(batches).combine_chunks())
    else:
        crowds = CrowdColumns(
            pa.concat_tables([pa.table(t.table) for t in tables]).combine_chunks()
        )
    numeric = ("window_start_ms", "window_end_ms", "instance", "messages_released")
    if any(crowds.column(name).null_count for name in numeric):
        return [None] * len(tables)
    start, end, instances, messages = (
        crowds.column(name).to_numpy(zero_copy_only=False).astype(np.int64) for name in numeric
    )
    stems = np.array([[key.window_start, key.instance, key.bucket] for key in keys], np.int64)
    stem_start, stem_instance, stem_bucket = np.repeat(stems, lengths, axis=0).T
    status = crowds.column("status")
    released = pc.fill_null(pc.equal(status, "released"), False).to_numpy(zero_copy_only=False)
    withheld = pc.fill_null(pc.equal(status, "withheld"), False).to_numpy(zero_copy_only=False)
    respondents_column = crowds.column("respondents_released")
    stated = respondents_column.is_valid().to_numpy(zero_copy_only=False)
    respondents = pc.fill_null(respondents_column, 0).to_numpy(zero_copy_only=False)
    respondents = np.where(released, respondents, 0)
    fine = (
        (start == stem_start)
        & (end > start)
        & (instances == stem_instance)
        & (crowd_table_buckets(crowds, buckets) == stem_bucket)
        & (released | withheld)
        & np.where(released, stated, ~stated & (messages == 0))
        & (respondents >= 0)
        & (respondents <= MAX_RESPONDENTS_RELEASED)
        & (messages >= 0)
    )
    if instance is not None:
        fine &= instances == instance
    if isinstance(threshold, int):
        fine &= ~released | (respondents >= threshold)
    first = np.cumsum(lengths) - lengths  # each table's first row
    follows_none = np.zeros(rows, dtype=bool)
    follows_none[first[lengths > 0]] = True
    fine[1:] &= _crowd_order_rises(crowds) | follows_none[1:]
    out: list[CrowdTotals | None] = []
    for table_first, length in zip(first.tolist(), lengths.tolist(), strict=True):
        end_row = table_first + length
        if not fine[table_first:end_row].all():
            out.append(None)
            continue
        table_messages = messages[table_first:end_row]
        if length and int(table_messages.max()) > _INT64[1] // length:  # int64 sums exact
            out.append(None)
            continue
        released_count = int(released[table_first:end_row].sum())
        out.append(
            CrowdTotals(
                released=released_count,
                withheld=length - released_count,
                respondents=int(respondents[table_first:end_row].sum()),
                messages=int(table_messages.sum()),
            )
        )
    return out


def check_crowd_table(
    name: str,
    key: BucketKey,
    rows: Sequence[Mapping[str, Any]],
    parameters: Mapping[str, Any],
    instance: int | None,
    stem_records: int,
    checked: CrowdTotals | None = None,
) -> CrowdTotals:
    """Check one crowd table's rows (see the module docstring) against its stem ``key``, the
    commit's ``parameters`` (``crowd_buckets``, ``crowd_threshold``) and ``instance``, and the
    records its stem's message files hold (``stem_records``); its totals, or ReleaseError (one
    line naming ``name`` and the crowd). Rows given as :class:`CrowdColumns` are checked column
    by column (:func:`crowd_table_totals`; ``checked``: what it gave for them, when the caller
    checked many tables at once), row by row only when a row may be wrong."""
    buckets, threshold = parameters["crowd_buckets"], parameters.get("crowd_threshold")
    totals = checked
    if totals is None and isinstance(rows, CrowdColumns):  # row by row only to say what is wrong
        totals = crowd_table_totals([rows], [key], parameters, instance)[0]
    if totals is None:
        totals = _row_totals(name, key, rows, buckets, threshold, instance)
    if totals.messages != stem_records:
        raise ReleaseError(
            f"{name}: its crowds release {totals.messages} messages, the message files of its "
            f"bucket hold {stem_records} records"
        )
    return totals


def _row_totals(
    name: str,
    key: BucketKey,
    rows: Sequence[Mapping[str, Any]],
    buckets: Any,
    threshold: Any,
    instance: int | None,
) -> CrowdTotals:
    """:func:`check_crowd_table`'s checks row by row: the totals, or ReleaseError naming the
    first row refused."""
    totals = CrowdTotals()
    previous: tuple[str, str, int, str] | None = None
    for row in rows:
        problem = _row_problem(row, key, buckets, threshold, instance)
        order = crowd_order(row["channel"], row["recipe_id"], row["crowd_id"])
        if problem is None and previous is not None and order <= previous:
            problem = "is out of crowd order (or listed twice)"
        if problem is not None:
            raise ReleaseError(f"{name}: crowd {describe_crowd(row)} {problem}")
        previous = order
        if row["status"] == "released":
            totals.released += 1
            totals.respondents += row["respondents_released"]
            totals.messages += row["messages_released"]
        else:
            totals.withheld += 1
    return totals
