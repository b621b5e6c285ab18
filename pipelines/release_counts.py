"""Committed crowd counts must agree with the messages a release's files hold (issue #11).

A release's crowd tables (``esa-release/2``: ``crowds/<stem>.avro``, one per bucket of a window
and instance) state per crowd the messages it released (``messages_released``) and the
respondents (``respondents_released``, the analyzer's n). The files' SHA-256 checks say the files
are the committed ones, and ``schemas.release.commit.verify_release`` checks each table against its
stem and the totals; nothing there ties the per-crowd figures to the messages, so a table could
inflate n or relabel a crowd's recipe or channel. The analyzer's one pass over a release
(``pipelines.analyze.open_release``) goes stem by stem (one crowd table and its bucket's message
files at a time, so memory is bounded by the largest bucket, never by the number of crowds):
:func:`check_crowd_counts` reads the stem's message files
in Arrow column batches of the crowd-key columns, counts records per (window_start, window_end,
channel, recipe_id, crowd_id) and refuses (one line naming the release and the crowd) when a
crowd read is not released in the stem's table or its record count differs from
``messages_released`` (chaff and messages the analyzer will dead-letter count too: they were
released in that crowd). Records whose key cannot be read (unreadable chunks) are left to the
pipeline's accounting.

``respondents_released`` is not compared with the message count: presence messages are never
released, so a respondent may have sent no data message to one instance.

``esa analyze`` makes the same check inside its pipeline (:class:`CheckCrowdCounts`), from the
records per crowd key its workers count in every batch they decode anyway
(``transforms.analyzer.aggregate.crowd_record_counts``), so the driver decodes no message file: a
problem fails the pipeline before ``summary.json`` is written (:func:`refuse_on_problems`), and
the driver removes what was written and refuses with the same line. ``open_release`` with
``count_messages=True`` (``esa train``) still checks on the driver, bucket by bucket.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipelines.commandline.main import UsageError
from schemas.release import commit
from schemas.release.crowd_buckets import CROWDS_DIR, parse_release_path
from transforms.analyzer.aggregate import (
    CROWD_KEY_COLUMNS,
    CROWD_RECORD_SCHEMA,
    crowd_record_counts,
    pack_crowd_records,
    stated_records,
    unpack_crowd_record_table,
    unpack_crowd_records,
)
from transforms.common import atomic_files, avro_io

__all__ = [
    "CheckCrowdCounts",
    "CrowdKey",
    "RefusedRelease",
    "check_crowd_counts",
    "count_crowd_messages",
    "crowd_count_problem",
    "read_refusal",
    "refuse_on_problems",
    "release_stems",
]

# (window_start_ms, window_end_ms, channel, recipe_id, crowd_id)
CrowdKey = tuple[int, int, str, str, str | None]


def count_crowd_messages(
    files: Sequence[str], batch_records: int = avro_io.DEFAULT_BATCH_RECORDS
) -> Counter[CrowdKey]:
    """Records per crowd key in ``files`` (unreadable chunks and batches lacking a key column are
    skipped: their records are the pipeline's dead letters)."""
    counts: Counter[CrowdKey] = Counter()
    for path in files:
        for item in avro_io.read_avro_batches(path, batch_records):
            if not isinstance(item, avro_io.UnreadableChunk):
                counts.update(crowd_record_counts(item.columns))
    return counts


def _describe(key: CrowdKey) -> str:
    start, end, channel, recipe_id, crowd_id = key
    return json.dumps(
        {"window_start_ms": start, "window_end_ms": end, "channel": channel,
         "recipe_id": recipe_id, "crowd_id": crowd_id},
        ensure_ascii=False,
    )  # fmt: skip


def check_crowd_counts(
    path: str,
    crowds: Sequence[Mapping[str, Any]],
    files: Sequence[str],
    batch_records: int = avro_io.DEFAULT_BATCH_RECORDS,
) -> None:
    """UsageError (one line naming ``path`` and the crowd) unless every crowd read from
    ``files`` is released in ``crowds`` with ``messages_released`` equal to its record count, and
    every released crowd's count is what the files hold."""
    problem = crowd_count_problem(
        path, stated_counts(crowds), count_crowd_messages(files, batch_records)
    )
    if problem is not None:
        raise UsageError(problem)


def stated_counts(crowds: Iterable[Mapping[str, Any]]) -> dict[CrowdKey, int]:
    """Per crowd key of a crowd table its ``messages_released`` (-1 for a withheld crowd):
    ``transforms.analyzer.aggregate.stated_records``."""
    return stated_records(crowds)


def crowd_count_problem(
    path: str, stated: Mapping[CrowdKey, int], read: Mapping[CrowdKey, int]
) -> str | None:
    """The refusal line for release ``path`` when the records ``read`` per crowd key disagree
    with the crowd table's ``stated`` counts (:func:`stated_counts`) of one bucket; else None."""
    ordered = sorted(read.items(), key=lambda item: repr(item[0]))
    for key, count in ordered:  # first crowds not released at all (relabelled, removed)
        committed = stated.get(key)
        if committed is None or committed < 0:
            why = "not released" if committed is None else "withheld"
            return (
                f"refusing release {path}: its files hold {count} messages of crowd "
                f"{_describe(key)}, which its commit record lists as {why}"
            )
    for key, count in ordered:
        if stated[key] != count:
            return (
                f"refusing release {path}: crowd {_describe(key)} states messages_released "
                f"{stated[key]}, its files hold {count}"
            )
    for key, committed in stated.items():
        if committed > 0 and key not in read:
            return (
                f"refusing release {path}: crowd {_describe(key)} states messages_released "
                f"{committed}, its files hold 0"
            )
    return None


# A combiner's pending record tables are added up once they hold this many rows, or as many as
# its added-up blob.
_PENDING_ROWS = 1 << 12
_KEYS = list(CROWD_KEY_COLUMNS)


def _sum_records(tables: list[pa.Table]) -> pa.Table:
    """Record tables added up per crowd key (one row per crowd)."""
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    grouped = table.group_by(_KEYS, use_threads=False).aggregate([("records", "sum")])
    arrays = [grouped.column(name) for name in _KEYS] + [grouped.column("records_sum")]
    return pa.Table.from_arrays(arrays, schema=CROWD_RECORD_SCHEMA)


class _Records:
    """A bucket's records per crowd key while they are added: the added-up part as one packed
    blob and the tables added since (folded in once they weigh as much). A bucket given one
    blob only (the common case: its crowds were read in one batch, or were added up upstream)
    passes it on as it is, unopened: every blob here has one row per crowd key already (a
    batch's :func:`crowd_record_table` is grouped by key, and so is every sum made here)."""

    __slots__ = ("alone", "packed", "packed_rows", "pending", "pending_rows")

    def __init__(self) -> None:
        self.alone: bytes | None = None
        self.packed: bytes | None = None
        self.packed_rows = 0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def add_blob(self, blob: bytes) -> None:
        if self.alone is None and self.packed is None and not self.pending:
            self.alone = blob
            return
        if self.alone is not None:
            self.add(unpack_crowd_record_table(self.alone))
            self.alone = None
        self.add(unpack_crowd_record_table(blob))

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if self.pending_rows >= max(_PENDING_ROWS, self.packed_rows):
            self.fold()

    def fold(self) -> None:
        if not self.pending:
            return
        tables = self.pending
        if self.packed is not None:
            tables = [unpack_crowd_record_table(self.packed), *tables]
        total = _sum_records(tables)
        self.packed, self.packed_rows = pack_crowd_records(total), total.num_rows
        self.pending, self.pending_rows = [], 0

    def blob(self) -> bytes:
        if self.alone is not None:
            return self.alone
        self.fold()
        return self.packed if self.packed is not None else pack_crowd_records({})


class _AddCrowdRecords(beam.CombineFn):
    """Adds packed record blobs (``pack_crowd_records``: Arrow columns) of one bucket with
    Arrow's group-by; the accumulator keeps what it added up packed and the tables added
    since as columns (:class:`_Records`), and is one packed blob as it crosses a grouping
    (``compact``) and as the output, so memory stays flat in the number of crowds."""

    def create_accumulator(self) -> _Records:
        return _Records()

    def add_input(self, total: _Records | bytes, records: bytes) -> _Records:
        total = self._open(total)
        total.add_blob(records)
        return total

    def merge_accumulators(self, accumulators: Iterable[_Records | bytes]) -> _Records:
        total = _Records()
        for accumulator in accumulators:
            total.add_blob(accumulator if isinstance(accumulator, bytes) else accumulator.blob())
        return total

    def compact(self, total: _Records | bytes) -> bytes:
        return total if isinstance(total, bytes) else total.blob()

    def extract_output(self, total: _Records | bytes) -> bytes:
        return self.compact(total)

    @staticmethod
    def _open(total: _Records | bytes) -> _Records:
        if isinstance(total, bytes):
            opened = _Records()
            opened.add_blob(total)
            return opened
        return total


def _agree(stated: pa.Table, read: pa.Table) -> bool:
    """Whether a bucket's records read (one row per crowd key) are exactly its crowd table's
    stated counts (keys unique): each read crowd stated released with as many messages, and
    every crowd stated with messages read, i.e. the read rows are the stated rows with
    messages, as sets. Columnar: both sorted by key (a null crowd ID sorts like any value)."""
    stated = stated.filter(pc.greater(stated.column("records"), 0))
    if stated.num_rows != read.num_rows:
        return False
    order = [(name, "ascending") for name in _KEYS]
    return stated.sort_by(order).equals(read.sort_by(order))


def _problems(joined: tuple[Any, Mapping[str, Sequence[Any]]]) -> Iterator[str]:
    (directory, _), found = joined
    read_blobs = list(found["read"])
    if len(read_blobs) == 1:  # the bucket's records added up already (CombinePerKey)
        read = read_blobs[0]
    else:
        read = _AddCrowdRecords().extract_output(_AddCrowdRecords().merge_accumulators(read_blobs))
    if len(found["stated"]) == 1:  # one crowd table: its keys are unique (checked in order)
        stated_table = unpack_crowd_record_table(found["stated"][0])
        if _agree(stated_table, unpack_crowd_record_table(read)):
            return
    stated: dict[CrowdKey, int] = {}
    for table in found["stated"]:
        stated.update(unpack_crowd_records(table))
    problem = crowd_count_problem(directory, stated, unpack_crowd_records(read))
    if problem is not None:
        yield problem


class CheckCrowdCounts(beam.PTransform):
    """``(((release directory, bucket key), {crowd key: records}) per decoded batch, ((release
    directory, bucket key), {crowd key: messages_released}) per crowd table)`` (packed blobs:
    ``AggregateOutputs.crowd_records`` and ``stated_records``, the tables read once with their
    crowds) -> the refusal line of every bucket whose files disagree with its crowd table
    (:func:`crowd_count_problem`; normally none), one bucket per element: memory per worker
    bounded by a bucket's crowds."""

    def expand(self, inputs: tuple[beam.PCollection, beam.PCollection]) -> beam.PCollection:
        records, stated = inputs
        read = records | "RecordsPerBucket" >> beam.CombinePerKey(_AddCrowdRecords())
        return (
            {"read": read, "stated": stated}
            | "JoinBuckets" >> beam.CoGroupByKey()
            | "Disagreements" >> beam.FlatMap(_problems)
        )


class RefusedRelease(Exception):
    """A release whose files disagree with its crowd tables (the refusal line)."""


REFUSAL_FILE = "refused.txt"


def refuse_on_problems(counts: Any, problems: Sequence[str], directory: str) -> Any:
    """``counts`` unchanged when there is no problem; else the first refusal line is written to
    ``directory/refused.txt`` (read by :func:`read_refusal`) and the pipeline fails."""
    if not problems:
        return counts
    line = min(problems)
    atomic_files.publish_bytes(directory, REFUSAL_FILE, line.encode("utf-8"))
    raise RefusedRelease(line)


def read_refusal(directory: str) -> str | None:
    """The refusal line :func:`refuse_on_problems` wrote under ``directory``, if any."""
    path = FileSystems.join(directory, REFUSAL_FILE)
    try:
        if not FileSystems.exists(path):
            return None
        with avro_io.open_input(path) as handle:
            return handle.read().decode("utf-8")
    except (OSError, ValueError):
        return None


def release_stems(verified: commit.VerifiedRelease) -> Iterator[tuple[str, list[str]]]:
    """``(crowd table, its stem's message files)`` of a verified ``esa-release/2`` release, table
    by table (paths joined as ``verified.files``; every message file's stem has a table)."""
    messages: dict[Any, list[str]] = {}
    tables: list[tuple[Any, str]] = []
    for entry, path in zip(verified.entries, verified.files, strict=True):
        parsed = parse_release_path(entry.path)
        if parsed is None:
            continue
        directory, key, _ = parsed
        if directory == CROWDS_DIR:
            tables.append((key, path))
        else:
            messages.setdefault(key, []).append(path)
    for key, table in tables:
        yield table, messages.get(key, [])
