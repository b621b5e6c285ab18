"""The analyzer's first half as Beam transforms: released messages in, count arrays per crowd
bucket out.

:class:`AggregateReleases` takes the committed ShuffledMessage Avro files of every release and
its committed crowd tables (``esa-release/2``: ``(instance, path, SHA-256)`` of each, read by
``read_crowds``; in the analyze pipeline a few tables per element, decoded together). Each file is read in column batches (``transforms.common.avro_io``: one Beam
element per batch, never per message); a batch is verified (schema version, window, CRC32C, a
known recipe on its channel), its payloads decoded per recipe, and its randomized messages
counted into partial accumulators per crowd (``transforms.analyzer.arithmetic.aggregate_batch``), which
leave as one :class:`~transforms.analyzer.arithmetic.CrowdBucket` per crowd bucket the batch touches
(a file may hold any number of crowds).

The unit of parallel work is a :class:`FileRange`, never a whole file: :class:`PlanRanges` walks
each file's block headers (seeking over the block data) and cuts it into runs of whole blocks of
at most ``range_records`` records, which are spread over the workers, so one crowd of millions
of messages in one file is decoded, opened and counted by every worker. A file whose block walk
fails (or whose schema or codec cannot be decoded, or that has one range only) is one range read
from start to end by the whole-file reader, as a hostile file always was. See
:class:`DecodeReleaseFile` for why a file cut into ranges gives exactly what reading it whole
gives (replays discarded, dead letters and their record numbers, counters). Each released crowd of a crowd table becomes a partial
accumulator holding only n_u, the respondents instance u states it released
(``respondent_accumulators``): n never comes from messages; each withheld crowd a record in its
bucket. A combiner adds the buckets per (kind, window, bucket) (longitudinal crowds: per window
length, their rounds span d windows), never one element per crowd. Unreadable chunks and
undecodable messages go to the ``dead_letters`` output with their reason; counters account for
every record read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from schemas import schema_json
from schemas.dead_letters import dead_letter
from schemas.payloads import EncodedPayloads
from schemas.release.commit import COMMIT_FILE
from schemas.release.crowd_buckets import CROWDS_DIR, BucketKey, parse_release_path
from schemas.release.crowd_tables import (
    CrowdColumns,
    parse_crowd_table,
    parse_crowd_table_columns,
)
from schemas.replays import DUPLICATE_PAYLOAD
from transforms.analyzer import arithmetic
from transforms.analyzer import opening as sealed_payloads
from transforms.analyzer.tables import compress_batch, decompress_batch
from transforms.common import avro_io, counters
from transforms.common.combiners import SumCounts

METRICS_NAMESPACE = "esa.analyze"
STAGE_READ = "analyze.read"
STAGE_DECODE = "analyze.decode"
DEAD_LETTER_TAG = "dead_letter"
COUNTS_TAG = "counts"
# Outputs of a range of a file cut into several, held back until the file's ranges are checked.
PENDING_TAG = "pending"
CHECKS_TAG = "checks"
# Records per crowd key of each batch, keyed by release file bucket (pipelines/release_counts.py).
CROWD_RECORDS_TAG = "crowd_records"
CROWD_KEY_COLUMNS = ("window_start", "window_end", "channel", "recipe_id", "crowd_id")
# Records (or messages released: -1 for a withheld crowd) per crowd key, as blobs carry them.
CROWD_RECORD_SCHEMA = pa.schema(
    [
        ("window_start", pa.int64()),
        ("window_end", pa.int64()),
        ("channel", pa.string()),
        ("recipe_id", pa.string()),
        ("crowd_id", pa.string()),
        ("records", pa.int64()),
    ]
)
# Messages released per crowd key of each crowd table, keyed by release file bucket (read with
# the table's crowds: ``CrowdBuckets`` with ``stated_bucket``).
STATED_TAG = "stated"
# (recipe ID, respondents released) of a source's released crowds, each pair once per element.
SIZES_TAG = "sizes"
BUCKETS_TAG = "buckets"
# Records per range of a release file (``esa analyze --range-records``).
DEFAULT_RANGE_RECORDS = 20_000
# The Beam counter of bundles that decoded records (how far one crowd's work spread).
BUNDLES_DECODING = "bundles_decoding"
# The Beam counter of files cut into ranges that were read whole after all.
READ_WHOLE_AFTER_RANGES = "files_read_whole_after_ranges"
# Dead letters are emitted in lists of at most this many (one Beam element per list).
DEAD_LETTERS_PER_ELEMENT = 1000


def _inc(counts: dict[str, int], name: str, value: int) -> None:
    counters.count(counts, METRICS_NAMESPACE, name, value)


@dataclass(frozen=True)
class FileRange:
    """Records ``first_record .. first_record + records - 1`` of release file ``path``: the whole
    blocks in bytes ``start .. stop - 1``, one of the file's ``ranges`` ranges. A file of one
    range is read from start to end (``start``, ``stop`` and ``records`` unused)."""

    path: str
    start: int = 0
    stop: int = 0
    first_record: int = 0
    records: int = 0
    ranges: int = 1

    @property
    def whole(self) -> bool:
        return self.ranges == 1

    @classmethod
    def whole_file(cls, path: str) -> FileRange:
        return cls(path)


class PlanRanges(beam.DoFn):
    """``path`` -> its :class:`FileRange` s of at most ``range_records`` records each (block
    headers read, block data seeked over: ``transforms.common.avro_io.block_windows``), or the
    whole file as one range when it cannot be cut (see the module docstring)."""

    def __init__(self, range_records: int = DEFAULT_RANGE_RECORDS) -> None:
        if range_records < 1:
            raise ValueError(f"range_records must be >= 1, got {range_records}")
        self._range_records = int(range_records)

    def process(self, path: str) -> Iterator[FileRange]:
        expect = schema_json("shuffled_message")
        windows = avro_io.block_windows(path, self._range_records, expect)
        if windows is None or len(windows) < 2:
            yield FileRange.whole_file(path)
            return
        for start, stop, first, records in windows:
            yield FileRange(path, start, stop, first, records, len(windows))


@beam.typehints.with_output_types(typing.Any)
class DecodeReleaseFile(beam.DoFn):
    """A :class:`FileRange` (or a path: the whole file) -> ``(bucket key, partial CrowdBucket)``
    per crowd bucket and batch; tagged ``dead_letter`` (lists of DeadLetter dicts) and
    ``counts`` (dicts of counters) outputs.

    A range of a file cut into several sends all of these to the ``pending`` output instead, as
    ``(path, tag, value)``, and to ``checks`` a ``(path, (unreadable, fingerprints))``: whether
    it met an unreadable chunk, and the fingerprints (``schemas.replays.payload_fingerprints``)
    of the sealed payloads it kept. :class:`AggregateReleases` releases a file's pending outputs
    only when no range met an unreadable chunk and no fingerprint occurs in two of its ranges;
    otherwise it drops them and reads the file whole. Why that is exactly the whole-file result:

    * Replays (``arithmetic.FileReplays``: a sealed payload that an earlier record of the same
      crowd in the file holds byte for byte is discarded, ``duplicate_payload``). A range finds
      the repeats whose earlier copy lies in the range; each of those is a repeat in the file.
      Conversely let record r repeat an earlier record of the file, and f be the first record of
      the file holding those bytes in r's crowd. f is kept by its range (nothing before it in the
      file, so nothing before it in the range, holds them). If f and r share a range, the range
      discards r. If not, either r's range discards r (an earlier copy in r's range), or keeps
      r, and then f and r, in two ranges, have equal fingerprints and the file is read whole. So
      when the file is released, the ranges discard exactly the file's repeats.
    * Dead letters and record numbers. With no unreadable chunk in any range every block of the
      file decoded, each to exactly the records its header declares (the reader checks it), so a
      range's first record (the declared records of the blocks before it) is the whole-file
      reader's number of that record: ``path#record=N`` is the same. A file with any unreadable
      chunk is read whole, its chunks and numbering the whole-file reader's.
    * Counters are per record, so ranges add up to the file; ``files`` is counted by its first
      range. A file read whole after its ranges were dropped counts once, by that reading.
    """

    def __init__(
        self,
        book: arithmetic.RecipeBook,
        supported_versions: Iterable[int],
        batch_records: int = avro_io.DEFAULT_BATCH_RECORDS,
        dense_limit: int = arithmetic.DENSE_LIMIT,
        key_ring: str | None = None,
        buckets: int = arithmetic.ANALYZER_BUCKETS,
        release_buckets: Mapping[str, Any] | None = None,
    ) -> None:
        self._book = book
        self._buckets = int(buckets)
        # release directory -> its crowd_buckets S (release_file_analyzer_bucket)
        self._release_buckets = dict(release_buckets or {})
        self._versions = tuple(sorted(supported_versions))
        self._batch_records = batch_records
        self._dense_limit = dense_limit
        self._key_ring = key_ring  # sealed payloads: the key ring's PATH, never key bytes
        self._opener: sealed_payloads.ReleaseOpener | None = None
        self._bundle_decoded = False  # whether this bundle decoded records (BUNDLES_DECODING)
        self._unreadable = False  # whether the range being read met an unreadable chunk
        # (channel, recipe, crowd ID) -> its bucket of ``buckets``: a crowd's messages are in
        # a file per window, hashed once per worker (bounded: arithmetic.crowd_buckets_known)
        self._known_buckets: dict[tuple[Any, Any, Any], int] = {}

    def setup(self) -> None:
        # Private keys are read here, on the worker; without a ring, sealed payloads are refused.
        recipes = {recipe_id: self._book.get(recipe_id) for recipe_id in self._book.ids()}
        self._opener = sealed_payloads.ReleaseOpener.load(self._key_ring, recipes)

    def start_bundle(self) -> None:
        self._bundle_decoded = False

    def finish_bundle(self) -> None:
        if self._bundle_decoded:
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, BUNDLES_DECODING).inc()

    def process(self, element: FileRange | str) -> Iterator[Any]:
        piece = FileRange.whole_file(element) if isinstance(element, str) else element
        if piece.whole:
            yield from self._decode(piece)
            return
        self._unreadable = False
        replays = arithmetic.FileReplays()
        for output in self._decode(piece, replays):
            tag = getattr(output, "tag", BUCKETS_TAG)
            value = getattr(output, "value", output)
            yield beam.pvalue.TaggedOutput(PENDING_TAG, (piece.path, tag, value))
        fingerprints = replays.fingerprints()
        if self._unreadable or fingerprints.size:
            check = (self._unreadable, fingerprints)
            yield beam.pvalue.TaggedOutput(CHECKS_TAG, (piece.path, check))

    def _decode(
        self, piece: FileRange, replays: arithmetic.FileReplays | None = None
    ) -> Iterator[Any]:
        path = piece.path
        counts: dict[str, int] = {"files": 1} if piece.first_record == 0 else {}
        replays = arithmetic.FileReplays() if replays is None else replays
        expect = schema_json("shuffled_message")  # else the whole file is schema_mismatch
        window = None if piece.whole else (piece.start, piece.stop, piece.first_record)
        bucket = release_bucket(path)
        every_crowd_in = release_file_analyzer_bucket(bucket, self._buckets, self._release_buckets)
        for item in avro_io.read_counted_batches(path, self._batch_records, expect, window):
            if isinstance(item, avro_io.UnreadableChunk):
                self._unreadable = True
                if item.records is None:  # nobody knows how many: the balance cannot hold
                    _inc(counts, f"unknown_records:{item.reason}", 1)
                _inc(counts, "read", item.records or 0)
                _inc(counts, f"rejected:{item.reason}", item.records or 0)
                letter = item.dead_letter(STAGE_READ)
                yield beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, [letter])
                continue
            self._bundle_decoded = self._bundle_decoded or item.rows > 0
            columns, opened = item.columns, None
            # The batch's payloads and crowds, found once for the steps below while they look
            # at the batch as read (dropped once rows are taken out).
            payloads, groups = _payloads_and_crowds(columns)
            if bucket is not None:  # every record read, whatever becomes of it
                records = pack_crowd_records(crowd_record_table(columns, groups))
                yield beam.pvalue.TaggedOutput(CROWD_RECORDS_TAG, (bucket, records))
            # Repeats of a sealed payload in a crowd of this file are discarded, counted.
            repeated = replays.repeated(columns, payloads)
            kept = np.flatnonzero(~repeated)  # positions of ``columns`` rows in the file's batch
            replayed = np.flatnonzero(repeated)
            rejections = [_Rejections(replayed, [DUPLICATE_PAYLOAD] * replayed.size)]
            if repeated.any():
                _inc(counts, "read", int(np.count_nonzero(repeated)))
                _inc(counts, f"rejected:{DUPLICATE_PAYLOAD}", int(np.count_nonzero(repeated)))
                columns, payloads, groups = columns.take(pa.array(kept)), None, None
            if self._opener is not None:  # -- sealed payloads: open before decoding --
                opened = self._opener.open_batch(columns, payloads)
                if opened.columns is not columns:
                    columns, payloads, groups = opened.columns, None, None
                for name, value in opened.counts.items():
                    _inc(counts, name, value)
                rejections.append(_Rejections(kept[opened.rejected_rows], opened.rejected_reasons))
                kept = kept[opened.kept_rows]
            result = arithmetic.aggregate_batch(
                columns, self._book, self._versions, self._dense_limit, True, payloads, groups
            )
            result = dataclasses.replace(result, rejected_rows=kept[result.rejected_rows])
            rejections.append(result)
            for name, value in result.counts.items():
                _inc(counts, name, value)
            accumulators, rows = result.accumulators, result.rows
            for rejection in rejections:
                if rejection.rejected_rows.size:
                    if rows:  # rejections are added to accumulators: every crowd one
                        accumulators, rows = result.all_accumulators(), []
                    yield from self._dead_letters(item, rejection)
                    found = arithmetic.rejected_accumulators(
                        item.columns,
                        rejection.rejected_rows,
                        rejection.rejected_reasons,
                        self._book,
                    )
                    accumulators = _with_rejections(accumulators, found)
            buckets = arithmetic.bucket_accumulators(
                accumulators, self._buckets, rows, self._known_buckets, every_crowd_in
            )
            yield from buckets.items()
        yield beam.pvalue.TaggedOutput(COUNTS_TAG, counts)

    @staticmethod
    def _dead_letters(item: avro_io.ColumnBatch, result: Any) -> Iterator[Any]:
        rejected = item.columns.take(result.rejected_rows)
        records = rejected.to_pylist()
        letters = [
            dead_letter(
                STAGE_DECODE,
                reason,
                f"shuffled message rejected by the analyzer: {reason}",
                f"{item.source}#record={item.first_record + int(row)}",
                original_record=record,
            )
            for row, reason, record in zip(
                result.rejected_rows.tolist(), result.rejected_reasons, records, strict=True
            )
        ]
        for start in range(0, len(letters), DEAD_LETTERS_PER_ELEMENT):
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER_TAG, letters[start : start + DEAD_LETTERS_PER_ELEMENT]
            )


def release_bucket(path: str) -> tuple[str, BucketKey] | None:
    """``(release directory, bucket key)`` of a release's message file or crowd table
    (``<directory>/messages/<stem>-g<group>.avro``, ``<directory>/crowds/<stem>.avro``); None
    for a path of neither layout."""
    directory, _, name = path.rpartition("/")
    release, _, kind = directory.rpartition("/")
    parsed = parse_release_path(f"{kind}/{name}")
    return None if parsed is None or not release else (release, parsed[1])


def _payloads_and_crowds(
    batch: pa.RecordBatch,
) -> tuple[EncodedPayloads | None, tuple[np.ndarray, np.ndarray] | None]:
    """The batch's ``EncodedPayloads.from_arrow`` of its payload column and
    ``arithmetic.crowd_groups`` of its crowd key columns (None where it lacks them)."""
    names = batch.schema.names
    payloads = EncodedPayloads.from_arrow(batch.column("payload")) if "payload" in names else None
    groups = None
    if batch.num_rows and all(name in names for name in CROWD_KEY_COLUMNS):
        groups = arithmetic.crowd_groups([batch.column(name) for name in CROWD_KEY_COLUMNS])
    return payloads, groups


def crowd_record_table(
    batch: pa.RecordBatch, groups: tuple[np.ndarray, np.ndarray] | None = None
) -> pa.Table:
    """Records per crowd key of a batch as a table: :data:`CROWD_RECORD_SCHEMA` (the key
    columns, window bounds in ms, and ``records``), one row per crowd in no particular order
    (none when the batch lacks a key column; the count check sorts by key). ``groups``: the batch's
    ``arithmetic.crowd_groups`` of :data:`CROWD_KEY_COLUMNS`, when the caller has it (used
    when no key is null: its -1 codes would join a null to -1)."""
    if batch.num_rows == 0 or any(n not in batch.schema.names for n in CROWD_KEY_COLUMNS):
        return CROWD_RECORD_SCHEMA.empty_table()
    columns = []
    for name, field in zip(CROWD_KEY_COLUMNS, CROWD_RECORD_SCHEMA, strict=False):
        column = batch.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.int64())
        columns.append(column.cast(field.type))
    if groups is not None and not any(column.null_count for column in columns):
        order, starts = groups
        rows = pa.array(order[starts[:-1]])  # a row of each crowd
        records = pa.array(np.diff(starts), pa.int64())
        return pa.Table.from_arrays([column.take(rows) for column in columns] + [records],
                                    schema=CROWD_RECORD_SCHEMA)  # fmt: skip
    # One crowd: no hashing (the crowd ID, likeliest to vary, is looked at first).
    if all(arithmetic.is_constant(column) for column in reversed(columns)):
        keys = [column.slice(0, 1) for column in columns]
        return pa.Table.from_arrays([*keys, pa.array([batch.num_rows], pa.int64())],
                                    schema=CROWD_RECORD_SCHEMA)  # fmt: skip
    names = list(CROWD_KEY_COLUMNS)
    # One thread: a batch is small, and a thread pool's hand-offs cost more than its grouping.
    table = pa.Table.from_arrays(columns, names)
    grouped = table.group_by(names, use_threads=False).aggregate([([], "count_all")])
    arrays = [grouped.column(name) for name in names] + [grouped.column("count_all")]
    return pa.Table.from_arrays(arrays, schema=CROWD_RECORD_SCHEMA)


def crowd_record_counts(batch: pa.RecordBatch) -> dict[tuple, int]:
    """Records per crowd key ``(window_start ms, window_end ms, channel, recipe_id, crowd_id)``
    of a batch (none when it lacks a key column)."""
    return crowd_records_dict(crowd_record_table(batch))


def crowd_records_dict(table: pa.Table) -> dict[tuple, int]:
    """A :data:`CROWD_RECORD_SCHEMA` table as ``{crowd key: records}``."""
    keys = [table.column(name).to_pylist() for name in CROWD_KEY_COLUMNS]
    records = table.column("records").to_pylist()
    return dict(zip(zip(*keys, strict=True), records, strict=True))


def crowd_records_table(records: Mapping[tuple, int]) -> pa.Table:
    """``{crowd key: records}`` as a :data:`CROWD_RECORD_SCHEMA` table."""
    keys = list(records)
    columns = [pa.array([key[index] for key in keys], field.type)
               for index, field in enumerate(list(CROWD_RECORD_SCHEMA)[:-1])]  # fmt: skip
    columns.append(pa.array(list(records.values()), pa.int64()))
    return pa.Table.from_arrays(columns, schema=CROWD_RECORD_SCHEMA)


def pack_crowd_records(records: Mapping[tuple, int] | pa.Table) -> bytes:
    """``{crowd key: records}`` (or its :func:`crowd_record_table`) as one compressed blob:
    Arrow columns, so that what crosses the count check's groupings per batch or bucket is one
    bytes object, never a Python object per crowd (FnApiRunner holds a grouping's values
    decoded, so per-crowd objects would make memory grow with the crowds), and adding and
    comparing blobs is columnar (``pipelines.release_counts``). Compressed as the analysis's
    other batches are (``tables.compress_batch``)."""
    table = records if isinstance(records, pa.Table) else crowd_records_table(records)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, CROWD_RECORD_SCHEMA) as writer:
        writer.write_table(table)
    return compress_batch(sink.getvalue().to_pybytes())


def unpack_crowd_record_table(blob: bytes) -> pa.Table:
    """The :data:`CROWD_RECORD_SCHEMA` table of :func:`pack_crowd_records` (blobs this
    pipeline made)."""
    return pa.ipc.open_stream(pa.py_buffer(decompress_batch(blob))).read_all()


def unpack_crowd_records(blob: bytes) -> dict[tuple, int]:
    """The ``{crowd key: records}`` of :func:`pack_crowd_records` (blobs this pipeline made)."""
    return crowd_records_dict(unpack_crowd_record_table(blob))


class _Rejections(NamedTuple):
    """Rows of a batch (positions in the file's batch) rejected, one reason per row."""

    rejected_rows: np.ndarray
    rejected_reasons: list[str]


def _with_rejections(
    accumulators: dict[arithmetic.CrowdKey, arithmetic.Accumulator],
    rejected: Mapping[arithmetic.CrowdKey, arithmetic.Accumulator],
) -> dict[arithmetic.CrowdKey, arithmetic.Accumulator]:
    """The batch's accumulators with each crowd's rejections added (a crowd whose messages
    were all rejected gets an accumulator of rejections only: ``core.all_rejected_note``)."""
    return arithmetic.merge_into(accumulators, rejected.items())


def read_pinned_commit(directory: str, sha256: str | None) -> dict[str, Any]:
    """The commit record ``directory/_COMMIT.json``, read on a worker, if its SHA-256 is the one
    the driver verified (ValueError otherwise: a changed record is never read)."""
    path = FileSystems.join(directory, COMMIT_FILE)
    with avro_io.open_input(path) as handle:
        content = handle.read()
    if sha256 is None or hashlib.sha256(content).hexdigest() != sha256:
        raise ValueError(f"{path} is not the commit record that was verified (SHA-256 differs)")
    return json.loads(content)


def pinned_message_paths(commit: tuple[int, str, str | None]) -> Iterator[str]:
    """``(instance, release directory, SHA-256 of its verified _COMMIT.json)`` -> the path of
    every message file the record commits (never its crowd tables); run on workers."""
    _, directory, sha256 = commit
    for entry in read_pinned_commit(directory, sha256)["files"]:
        if not entry["path"].startswith(CROWDS_DIR + "/"):
            yield os.path.join(directory, *entry["path"].split("/"))


def pinned_crowd_tables(commit: tuple[int, str, str | None]) -> Iterator[tuple[int, str, str]]:
    """``(instance, release directory, SHA-256 of its verified _COMMIT.json)`` -> ``(instance,
    path, committed SHA-256)`` of every crowd table the record commits (``esa-release/2``)."""
    instance, directory, sha256 = commit
    for entry in read_pinned_commit(directory, sha256)["files"]:
        if entry["path"].startswith(CROWDS_DIR + "/"):
            yield instance, os.path.join(directory, *entry["path"].split("/")), entry["sha256"]


def pinned_crowd_table_records(
    table: tuple[int, str, str],
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(instance, crowd table path, committed SHA-256)`` -> ``(instance, crowd)`` for every
    row of the table, read only if its SHA-256 is the committed one (ValueError otherwise)."""
    instance, path, sha256 = table
    with avro_io.open_input(path) as handle:
        data = handle.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{path} is not the crowd table that was verified (SHA-256 differs)")
    for crowd in parse_crowd_table(data, path):
        yield instance, crowd


# Crowd tables per element of :func:`pinned_crowd_table_groups` (read and decoded together).
TABLES_PER_ELEMENT = 8

# (instance, path, committed SHA-256, the release's crowd_buckets)
CrowdTable = tuple[int, str, str, Any]


def commit_crowd_buckets(record: Mapping[str, Any]) -> Any:
    """The ``crowd_buckets`` parameter a commit record states (None when it states none as a
    mapping of parameters); checked by whoever uses it."""
    parameters = record.get("parameters")
    return parameters.get("crowd_buckets") if isinstance(parameters, Mapping) else None


def pinned_crowd_table_groups(commit: tuple[int, str, str | None]) -> Iterator[list[CrowdTable]]:
    """:func:`pinned_crowd_tables` with the record's ``crowd_buckets`` parameter, in lists of
    at most :data:`TABLES_PER_ELEMENT` (one element each: their tables are decoded together,
    :func:`pinned_crowd_table_group_records`)."""
    instance, directory, sha256 = commit
    record = read_pinned_commit(directory, sha256)
    shuffler_buckets = commit_crowd_buckets(record)
    group: list[CrowdTable] = []
    for entry in record["files"]:
        if entry["path"].startswith(CROWDS_DIR + "/"):
            path = os.path.join(directory, *entry["path"].split("/"))
            group.append((instance, path, entry["sha256"], shuffler_buckets))
            if len(group) >= TABLES_PER_ELEMENT:
                yield group
                group = []
    if group:
        yield group


def table_analyzer_bucket(table: CrowdTable, buckets: int) -> int | None:
    """The analyzer's bucket (of ``buckets``, :func:`arithmetic.bucket_key`) of every crowd of
    a crowd table ``(instance, path, SHA-256, the release's crowd_buckets S)``, without hashing
    a crowd, when ``buckets`` divides S: a crowd's bucket is one digest h modulo the number of
    buckets (``crowd_bucket``), and (h mod S) mod A = h mod A when A divides S; the driver
    checked that every crowd of the table hashes to its stem's bucket h mod S
    (``check_crowd_table``) and a worker reads the table only with the SHA-256 it verified.
    None otherwise (each crowd is hashed)."""
    shuffler_buckets = table[3] if len(table) > 3 else None
    return _stem_analyzer_bucket(release_bucket(table[1]), shuffler_buckets, buckets)


def release_file_analyzer_bucket(
    found: tuple[str, BucketKey] | None, buckets: int, release_buckets: Mapping[str, Any]
) -> int | None:
    """The analyzer's bucket (of ``buckets``) of every crowd of a release's message file, from
    its name (``found``: :func:`release_bucket` of its path) and its release's crowd_buckets S
    (``release_buckets``: release directory -> S), without hashing a crowd, when ``buckets``
    divides S: (h mod S) mod A = h mod A, as :func:`table_analyzer_bucket`. Why a crowd's
    messages in the file of stem bucket b hash to b: every record read is counted for the
    crowd-count check (``pipelines.release_counts``), which refuses the release unless each
    crowd of a bucket's files is one its crowd table releases; the driver checked that each
    crowd of that table hashes to the stem's bucket; and nothing is estimated or written
    before the check has passed. None otherwise (each crowd is hashed)."""
    shuffler_buckets = None if found is None else release_buckets.get(found[0])
    return _stem_analyzer_bucket(found, shuffler_buckets, buckets)


def _stem_analyzer_bucket(
    found: tuple[str, BucketKey] | None, shuffler_buckets: Any, buckets: int
) -> int | None:
    """The analyzer's bucket of a release file's stem bucket (``found``: :func:`release_bucket`)
    when ``buckets`` divides the release's ``shuffler_buckets`` (a positive int); else None."""
    if found is None or type(shuffler_buckets) is not int or shuffler_buckets < 1:
        return None
    return None if shuffler_buckets % buckets else found[1].bucket % buckets


class TableCrowds(Sequence[tuple[int, Mapping[str, Any]]]):
    """A crowd table's ``(instance, crowd)`` pairs (what :func:`pinned_crowd_table_records`
    yields) held as the table's columns (``crowds``, a ``CrowdColumns``): :class:`CrowdBuckets`
    counts and buckets them without a dict per crowd."""

    __slots__ = ("instance", "crowds")

    def __init__(self, instance: int, crowds: CrowdColumns) -> None:
        self.instance, self.crowds = instance, crowds

    def __len__(self) -> int:
        return len(self.crowds)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [(self.instance, crowd) for crowd in self.crowds.rows()[index]]
        return self.instance, self.crowds[index]

    def __iter__(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        instance = self.instance
        return ((instance, crowd) for crowd in self.crowds.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def pinned_crowd_table_group_records(
    group: list[CrowdTable],
) -> list[tuple[CrowdTable, Sequence[tuple[int, Mapping[str, Any]]]]]:
    """Each table of ``group`` with its ``(instance, crowd)`` pairs, as
    :func:`pinned_crowd_table_records` gives them (ValueError on a SHA-256 that is not the
    committed one), the tables decoded together as columns (``parse_crowd_table_columns``:
    numpy's cost is per call; :class:`TableCrowds`) where they can be, else one by one."""
    read = []
    for _, path, sha256, _ in group:
        with avro_io.open_input(path) as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"{path} is not the crowd table that was verified (SHA-256 differs)")
        read.append((data, path))
    parsed = parse_crowd_table_columns(read) if len(read) > 1 else None
    if parsed is not None:
        return [
            (table, TableCrowds(table[0], crowds))
            for table, crowds in zip(group, parsed, strict=True)
        ]
    return [
        (table, [(table[0], crowd) for crowd in parse_crowd_table(data, path)])
        for table, (data, path) in zip(group, read, strict=True)
    ]


def stated_records(crowds: Iterable[Mapping[str, Any]]) -> dict[tuple, int]:
    """Per crowd key ``(window_start ms, window_end ms, channel, recipe_id, crowd_id)`` of a
    crowd table its ``messages_released`` (-1 for a withheld crowd): what the count check
    (``pipelines.release_counts``) compares with :func:`crowd_record_counts`."""
    stated: dict[tuple, int] = {}
    for crowd in crowds:
        key = (
            crowd.get("window_start_ms"),
            crowd.get("window_end_ms"),
            crowd.get("channel"),
            crowd.get("recipe_id"),
            crowd.get("crowd_id"),
        )
        stated[key] = (
            int(crowd.get("messages_released") or 0) if crowd.get("status") == "released" else -1
        )
    return stated


def stated_record_table(crowds: CrowdColumns) -> pa.Table:
    """:func:`stated_records` of a crowd table's columns as its :data:`CROWD_RECORD_SCHEMA`
    table (what :func:`pack_crowd_records` makes of the dict), one row per crowd in the table's
    order (a verified table lists each crowd once: ``check_crowd_table``)."""
    released = pc.equal(crowds.column("status"), "released")
    if released.null_count:
        released = pc.fill_null(released, False)
    messages = crowds.column("messages_released")
    if messages.null_count:
        messages = pc.fill_null(messages, 0)
    records = pc.if_else(released, messages, pa.scalar(-1, pa.int64()))
    names = ("window_start_ms", "window_end_ms", "channel", "recipe_id", "crowd_id")
    columns = [crowds.column(name) for name in names]
    columns = [
        column if column.type == field.type else column.cast(field.type)
        for column, field in zip(columns, CROWD_RECORD_SCHEMA, strict=False)
    ]
    return pa.Table.from_arrays([*columns, records.cast(pa.int64())], schema=CROWD_RECORD_SCHEMA)


def crowd_table_bucket(table: tuple[int, str, str]) -> tuple[str, BucketKey] | None:
    """``(release directory, bucket key)`` of a committed crowd table ``(instance, path,
    SHA-256)`` (:func:`release_bucket` of its path)."""
    return release_bucket(table[1])


class CrowdBuckets(beam.DoFn):
    """A source of crowd records (e.g. a commit record) -> ``(bucket key, partial CrowdBucket)``
    per bucket its crowds fall in (``analyze_core.commit_buckets``): the released crowds' n_u and
    the withheld crowds' records, one element per bucket and source, never per crowd.

    With ``stated_bucket``, the source's crowds are also counted for the count check from the
    same read: ``(stated_bucket(source), packed stated_records)`` on output
    :data:`STATED_TAG` (nothing when it gives None). ``part_bucket(source, buckets)``: the
    bucket of all of a source's crowds when it is known without hashing them (None: hashed;
    :func:`table_analyzer_bucket`). ``grouped``: each element is a group of
    sources that ``read_crowds`` reads into ``(source, its crowds)`` pairs; each source is
    counted on its own and the group's crowds bucketed together (fewer partial buckets).

    On output :data:`SIZES_TAG`, each distinct ``(recipe ID, respondents released)`` of the
    released crowds read (:func:`released_sizes`): the crowd sizes whose privacy the reports
    will state, so that it is evaluated once per size before them (``EstimateBuckets``)."""

    def __init__(
        self,
        book: arithmetic.RecipeBook,
        read_crowds: Callable[[Any], Iterable[tuple[int, Mapping[str, Any]]]],
        buckets: int = arithmetic.ANALYZER_BUCKETS,
        stated_bucket: Callable[[Any], Any] | None = None,
        grouped: bool = False,
        part_bucket: Callable[[Any, int], int | None] | None = None,
    ) -> None:
        self._book, self._read_crowds, self._buckets = book, read_crowds, int(buckets)
        self._stated_bucket = stated_bucket
        self._grouped = bool(grouped)
        self._part_bucket = part_bucket

    def process(self, source: Any) -> Iterator[Any]:
        if self._grouped:  # a group of sources: each one's crowds (and stated counts) in turn
            parts = self._read_crowds(source)
        else:
            parts = [(source, self._read_crowds(source))]
        gathered: list[tuple[Sequence[tuple[int, Mapping[str, Any]]], int | None]] = []
        for part, part_crowds in parts:
            if not isinstance(part_crowds, TableCrowds):
                part_crowds = list(part_crowds)
            if self._stated_bucket is not None:
                bucket = self._stated_bucket(part)
                if bucket is not None:
                    if isinstance(part_crowds, TableCrowds):
                        stated = pack_crowd_records(stated_record_table(part_crowds.crowds))
                    else:
                        stated = pack_crowd_records(
                            stated_records(crowd for _, crowd in part_crowds)
                        )
                    yield beam.pvalue.TaggedOutput(STATED_TAG, (bucket, stated))
            known = None
            if self._part_bucket is not None:
                known = self._part_bucket(part, self._buckets)
            gathered.append((part_crowds, known))
        sizes: set[tuple[str, int]] = set()
        for part_crowds, _ in gathered:
            sizes |= released_sizes(part_crowds)
        for size in sorted(sizes):
            yield beam.pvalue.TaggedOutput(SIZES_TAG, size)
        tables = [(crowds.instance, crowds.crowds, known)
                  for crowds, known in gathered if isinstance(crowds, TableCrowds)]  # fmt: skip
        if gathered and len(tables) == len(gathered):  # all as columns: no dict per crowd
            yield from arithmetic.commit_table_buckets(tables, self._book, self._buckets).items()
            return
        pairs = [pair for crowds, _ in gathered for pair in crowds]
        buckets = [known for crowds, known in gathered for _ in range(len(crowds))]
        yield from arithmetic.commit_buckets(
            pairs, self._book, self._buckets, buckets if self._part_bucket else None
        ).items()


def released_sizes(crowds: Sequence[tuple[int, Mapping[str, Any]]]) -> set[tuple[str, int]]:
    """The distinct ``(recipe_id, respondents_released)`` of the released crowds of a crowd
    table's ``(instance, crowd)`` pairs (columns of a :class:`TableCrowds` read at once); crowds
    without a recipe ID or a count of at least 1 are left out (the buckets say what is wrong
    with them)."""
    if isinstance(crowds, TableCrowds):
        columns = crowds.crowds
        released = pc.fill_null(pc.equal(columns.column("status"), "released"), False)
        counts = columns.column("respondents_released")
        kept = pc.and_(released, pc.fill_null(pc.greater_equal(counts, 1), False))
        kept = pc.and_(kept, columns.column("recipe_id").is_valid())
        if not pc.any(kept).as_py():
            return set()
        pairs = (
            pa.table({"recipe_id": columns.column("recipe_id"), "count": counts})
            .filter(kept)
            .group_by(["recipe_id", "count"])
            .aggregate([])
        )
        return set(
            zip(pairs.column("recipe_id").to_pylist(), pairs.column("count").to_pylist(),
                strict=True)
        )  # fmt: skip
    sizes = set()
    for _, crowd in crowds:
        count, recipe_id = crowd.get("respondents_released"), crowd.get("recipe_id")
        if (
            crowd.get("status") == "released"
            and isinstance(recipe_id, str)
            and isinstance(count, int)
            and not isinstance(count, bool)
            and count >= 1
        ):
            sizes.add((recipe_id, count))
    return sizes


class CombineBucket(beam.CombineFn):
    """Adds partial :class:`~transforms.analyzer.arithmetic.CrowdBucket` accumulators of one bucket
    (per crowd: count arrays, respondents, counters; withheld records).

    The empty accumulator is ``None``. Inputs are never modified in value: buckets are added
    lazily as their packed blobs (``CrowdBucket.add``), so every key's accumulator stays mostly
    compressed while a bundle is combined; ``compact`` packs a bucket that holds objects before
    it crosses the grouping, and lets one made of blobs cross as them (``CrowdBucket.compact``);
    ``extract_output`` counts small domains densely (``CrowdBucket.densify``).
    """

    def __init__(self, dense_limit: int = arithmetic.DENSE_LIMIT) -> None:
        self._dense_limit = int(dense_limit)

    def create_accumulator(self) -> arithmetic.CrowdBucket | None:
        return None

    def add_input(
        self, accumulator: arithmetic.CrowdBucket | None, element: arithmetic.CrowdBucket
    ) -> arithmetic.CrowdBucket:
        if accumulator is None:
            accumulator = arithmetic.CrowdBucket()
        accumulator.add(element)
        return accumulator

    def merge_accumulators(
        self, accumulators: Iterable[arithmetic.CrowdBucket | None]
    ) -> arithmetic.CrowdBucket | None:
        result = None
        for accumulator in accumulators:
            if accumulator is None:
                continue
            if result is None:
                result = arithmetic.CrowdBucket()
            result.add(accumulator)
        return result

    def compact(self, accumulator: arithmetic.CrowdBucket | None) -> arithmetic.CrowdBucket | None:
        return None if accumulator is None else accumulator.compact()

    def extract_output(
        self, accumulator: arithmetic.CrowdBucket | None
    ) -> arithmetic.CrowdBucket | None:
        if accumulator is not None:
            accumulator.densify(self._dense_limit)
        return accumulator


class AggregateOutputs(NamedTuple):
    buckets: beam.PCollection  # (bucket key, CrowdBucket)
    dead_letters: beam.PCollection  # lists of DeadLetter dicts
    counts: beam.PCollection  # one dict of counters (global)
    # ((release directory, bucket key), {crowd key: records}) per batch of a release's file
    crowd_records: beam.PCollection
    # ((release directory, bucket key), packed stated_records) per crowd table (with
    # ``stated_bucket``; else empty)
    stated_records: beam.PCollection
    # (recipe ID, respondents released) of released crowds (CrowdBuckets' SIZES_TAG)
    crowd_sizes: beam.PCollection


class AggregateReleases(beam.PTransform):
    """(message file paths, crowd record sources) -> :class:`AggregateOutputs`.

    ``read_crowds(source)`` yields a source's ``(instance, crowd record)`` pairs (default: a
    committed crowd table, :func:`pinned_crowd_table_records`); or, with
    ``read_crowd_groups(sources)``, each source is a list of sources, read together into
    ``(source, its pairs)`` (:func:`pinned_crowd_table_group_records`), with
    ``part_bucket`` (:class:`CrowdBuckets`); ``buckets``: the analyzer's number of crowd
    buckets; ``release_buckets``: release directory -> its crowd_buckets, for the bucket of a
    message file's crowds without hashing them (:func:`release_file_analyzer_bucket`)."""

    def __init__(
        self,
        book: arithmetic.RecipeBook,
        supported_versions: Iterable[int],
        batch_records: int = avro_io.DEFAULT_BATCH_RECORDS,
        dense_limit: int = arithmetic.DENSE_LIMIT,
        key_ring: str | None = None,
        buckets: int = arithmetic.ANALYZER_BUCKETS,
        read_crowds: Callable[[Any], Iterable[tuple[int, Mapping[str, Any]]]] | None = None,
        range_records: int = DEFAULT_RANGE_RECORDS,
        stated_bucket: Callable[[Any], Any] | None = None,
        read_crowd_groups: Callable[[Any], Iterable[tuple[Any, Iterable[tuple[int, Any]]]]]
        | None = None,
        part_bucket: Callable[[Any, int], int | None] | None = None,
        release_buckets: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._plan = PlanRanges(range_records)
        self._decode = DecodeReleaseFile(
            book,
            supported_versions,
            batch_records,
            dense_limit,
            key_ring=key_ring,
            buckets=buckets,
            release_buckets=release_buckets,
        )
        if read_crowd_groups is not None:  # each source a list of sources
            self._crowds = CrowdBuckets(
                book, read_crowd_groups, buckets, stated_bucket, True, part_bucket
            )
        else:
            self._crowds = CrowdBuckets(
                book, read_crowds or pinned_crowd_table_records, buckets, stated_bucket
            )
        self._dense_limit = dense_limit

    def expand(self, inputs: tuple[beam.PCollection, beam.PCollection]) -> AggregateOutputs:
        files, crowd_sources = inputs
        outputs = (DEAD_LETTER_TAG, COUNTS_TAG, PENDING_TAG, CHECKS_TAG, CROWD_RECORDS_TAG)
        decoded = (
            files
            | "PlanRanges" >> beam.ParDo(self._plan)
            | "SpreadRanges" >> beam.Reshuffle()
            | "DecodeBatches" >> beam.ParDo(self._decode).with_outputs(*outputs, main=BUCKETS_TAG)
        )
        # Files cut into ranges: read whole instead when their ranges' checks say so.
        rereads = (
            decoded[CHECKS_TAG]
            | "ChecksPerFile" >> beam.GroupByKey()
            | "FilesToReadWhole" >> beam.FlatMap(_must_read_whole)
        )
        released = decoded[PENDING_TAG] | "ReleaseCheckedRanges" >> beam.ParDo(
            _ReleaseChecked(), beam.pvalue.AsList(rereads)
        ).with_outputs(DEAD_LETTER_TAG, COUNTS_TAG, CROWD_RECORDS_TAG, main=BUCKETS_TAG)
        whole = (
            rereads
            | "AsWholeFiles" >> beam.Map(FileRange.whole_file)
            | "DecodeWholeFiles"
            >> beam.ParDo(self._decode).with_outputs(*outputs, main=BUCKETS_TAG)
        )
        parts = (decoded, released, whole)
        from_commits = crowd_sources | "CrowdsFromCommits" >> beam.ParDo(self._crowds).with_outputs(
            STATED_TAG, SIZES_TAG, main=BUCKETS_TAG
        )
        buckets = (
            (*(part[BUCKETS_TAG] for part in parts), from_commits[BUCKETS_TAG])
            | "CountsAndRespondents" >> beam.Flatten()
            | "AddBuckets" >> beam.CombinePerKey(CombineBucket(self._dense_limit))
        )
        counts = (
            [part[COUNTS_TAG] for part in parts]
            | "AllCounters" >> beam.Flatten()
            | "AddCounters" >> beam.CombineGlobally(SumCounts())
        )
        letters = [part[DEAD_LETTER_TAG] for part in parts]
        dead_letters = letters | "AllDeadLetters" >> beam.Flatten()
        crowd_records = [part[CROWD_RECORDS_TAG] for part in parts]
        records = crowd_records | "AllCrowdRecords" >> beam.Flatten()
        return AggregateOutputs(
            buckets, dead_letters, counts, records, from_commits[STATED_TAG],
            from_commits[SIZES_TAG],
        )  # fmt: skip


def _must_read_whole(checks: tuple[str, Iterable[tuple[bool, np.ndarray]]]) -> Iterator[str]:
    """A file's path when one of its ranges met an unreadable chunk or two of them may hold one
    sealed payload (``arithmetic.repeats_across_ranges``): see :class:`DecodeReleaseFile`."""
    path, found = checks
    found = list(found)
    if any(unreadable for unreadable, _ in found) or arithmetic.repeats_across_ranges(
        [fingerprints for _, fingerprints in found]
    ):
        beam.metrics.Metrics.counter(METRICS_NAMESPACE, READ_WHOLE_AFTER_RANGES).inc()
        yield path


class _ReleaseChecked(beam.DoFn):
    """``(path, tag, value)`` held back by a range -> ``value`` on output ``tag``, unless the
    file is read whole instead (``rereads``)."""

    def process(self, pending: tuple[str, str, Any], rereads: list[str]) -> Iterator[Any]:
        path, tag, value = pending
        if rereads and path in set(rereads):
            return
        yield value if tag == BUCKETS_TAG else beam.pvalue.TaggedOutput(tag, value)


def metrics_summary(counts: Mapping[str, int]) -> dict[str, Any]:
    """The analyzer's counters with the balance check read = messages + chaff + rejected, in
    records (DESIGN.md invariant 5); it fails when some unreadable chunk held an unknown number
    of records."""
    rejected = counters.by_suffix(counts, "rejected:")
    unknown = counters.by_suffix(counts, "unknown_records:")
    read = int(counts.get("read", 0))
    messages = int(counts.get("messages", 0))
    chaff = int(
        counts.get("chaff", 0)
    )  # sealed cover messages, discarded (transforms/analyzer/opening.py)
    dead_lettered = sum(rejected.values())
    return {
        "files": int(counts.get("files", 0)),
        "read": read,
        "messages": messages,
        "chaff": chaff,
        "rejected_by_reason": rejected,
        "dead_lettered": dead_lettered,
        "chunks_of_unknown_records": unknown,
        "adds_up": read == messages + chaff + dead_lettered and not unknown,
    }
