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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import fastavro

from schemas import parsed_schema, schema_json
from schemas.avro import container
from schemas.avro.decode import decode_flat_blocks, flat_layout
from schemas.avro.schema import strip_logical_types
from schemas.regular_files import open_regular
from schemas.release.crowd_buckets import CROWDS_DIR, BucketKey, crowd_bucket, crowd_order

if TYPE_CHECKING:
    from schemas.release.commit import FileEntry

__all__ = [
    "CROWD_FIELDS",
    "MAX_RESPONDENTS_RELEASED",
    "ReleaseError",
    "CommittedRelease",
    "CrowdTotals",
    "crowd_table_paths",
    "read_crowd_table",
    "parse_crowd_table",
    "parse_crowd_tables",
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


def parse_crowd_tables(sources: Sequence[tuple[bytes, str]]) -> list[list[dict[str, Any]]] | None:
    """The rows of several crowd tables (``(bytes, name)`` each) as :func:`parse_crowd_table`
    gives them, all decoded at once as Arrow columns (``schemas.avro.decode.decode_flat_blocks``,
    every record checked exactly; numpy's cost is per call, so one call for many small tables);
    None when any table is not in the shuffler's own schema or does not decode that way: the
    caller then reads them one by one with :func:`parse_crowd_table`, which says what is wrong."""
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
    columns = [batch.column(field).to_pylist() for field in _TABLE_FIELDS]
    rows = [
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
    out, first = [], 0
    for records in per_table:
        out.append(rows[first : first + records])
        first += records
    return out


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


def check_crowd_table(
    name: str,
    key: BucketKey,
    rows: Sequence[Mapping[str, Any]],
    parameters: Mapping[str, Any],
    instance: int | None,
    stem_records: int,
) -> CrowdTotals:
    """Check one crowd table's rows (see the module docstring) against its stem ``key``, the
    commit's ``parameters`` (``crowd_buckets``, ``crowd_threshold``) and ``instance``, and the
    records its stem's message files hold (``stem_records``); its totals, or ReleaseError (one
    line naming ``name`` and the crowd)."""
    buckets, threshold = parameters["crowd_buckets"], parameters.get("crowd_threshold")
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
    if totals.messages != stem_records:
        raise ReleaseError(
            f"{name}: its crowds release {totals.messages} messages, the message files of its "
            f"bucket hold {stem_records} records"
        )
    return totals
