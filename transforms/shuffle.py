"""The ESA shuffler as Beam transforms (esa-privacy-revisited, Sections II-C and V).

``ShuffleReports`` takes a PCollection of Avro report file paths and returns the released groups,
the crowd manifests, the dead letters and the counts. Steps, each a small DoFn over column batches
whose logic lives in ``transforms/shuffle_core.py``:

1. ``ReadValidateSpill``: read a file in fastavro blocks (``avro_io``), validate every record
   (schema, version, recipe, channel, instance, origin, time, min crowd, payload, CRC32C),
   dead-letter the rejected ones, assign event-time windows, hash origins into shards (secret
   key), sort by (crowd, hash) and spill the batch to one file (an Arrow IPC record batch
   message per crowd); emit one small pointer (file, byte range) per (crowd, batch), timestamped
   with its window.
2. Window by event time; group pointers by crowd = (window, instance, channel, recipe, crowd ID).
   Pointers arriving in a late pane are dead-lettered (``late_data``): nothing is dropped.
3. ``PlanShards``/``CountShard``: split each crowd into 2**b origin shards by hash range (b from
   the crowd's message count), count distinct origins exactly per shard.
4. ``Decide``: sum respondents per crowd, apply the threshold and Algorithm 3, split the number
   of respondents to delete over shards (multivariate hypergeometric).
5. ``DeleteAndScatter``: per shard, delete all messages of uniformly chosen origins, strip origin,
   time and instance, and give every surviving message a fresh uniform random bucket.
   Buckets are merged into 2**g output groups per crowd, g from the released message count.
6. ``PermuteGroup``: per group, a uniform random permutation; one released file per group.

Only pointers and counts travel through Beam's shuffles: message data is spilled to files under
``spill_dir`` and read back by the shard or group that needs it, so no worker holds a crowd (or a
window, or a file) in memory, and the local runners' in-memory shuffles stay small. Every random
choice that shapes the release (noise, deleted respondents, groups, order) comes from the
operating system's CSPRNG (``privacy.noise.os_random_source``).
"""

from __future__ import annotations

import json
import secrets
import typing
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger as beam_trigger
from apache_beam.transforms import window as beam_window
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming

from privacy.noise import os_random_source
from schemas import SCHEMA_VERSION, parsed_schema, schema_json
from schemas.records import dead_letter
from transforms import avro_io
from transforms import shuffle_core as core
from transforms.combiners import SumCounts

METRICS_NAMESPACE = "esa.shuffle"
STAGE_READ = "shuffle.read"
STAGE_VALIDATE = "shuffle.validate"
STAGE_WINDOW = "shuffle.window"

# Count names in the ``counts`` output (and Beam counters of the same names).
READ = "read"
RELEASED = "released"
DELETED = "deleted"
WITHHELD = "withheld"
REJECTED_PREFIX = "rejected:"
# Unreadable chunks whose record count nobody knows, by reason: the balance cannot be checked.
UNKNOWN_PREFIX = "unknown_records:"

# Report columns kept in the first spill (the key columns travel in the pointer's key).
_SPILL_COLUMNS = ("origin", "event_time", "min_crowd_size", "payload", "payload_crc32c")
# Allowed lateness in streaming: effectively unbounded, so Beam never drops a late element
# silently; late panes are dead-lettered by PlanShards instead.
_UNBOUNDED_LATENESS = Duration(seconds=100 * 365 * 86_400)

CrowdKey = tuple[
    int, int, str, str, str | None
]  # (window_start_ms, instance, channel, recipe, crowd)


class Piece(NamedTuple):
    """Pointer to rows spilled as one Arrow IPC record batch message: bytes
    ``offset .. offset + length - 1`` of the spill file at ``path``."""

    path: str
    offset: int
    length: int
    rows: int
    source: str  # the input file the rows came from
    min_crowd: int  # the largest min_crowd_size among the rows


class ShardTask(NamedTuple):
    """One origin shard of a crowd: rows with hash top ``bits`` bits equal to ``shard``.

    ``piece_list`` points to the crowd's list of pieces (:func:`write_piece_list`), so that a
    task stays small however many input batches the crowd came from; ``min_crowd`` is the
    largest min_crowd_size in the crowd.
    """

    shard: int
    bits: int
    piece_list: Piece
    min_crowd: int


class ShardCount(NamedTuple):
    task: ShardTask
    respondents: int
    messages: int


class DeletionTask(NamedTuple):
    """Delete ``respondents_deleted`` of the shard's origins; scatter the surviving messages over
    2**bucket_bits uniform buckets (merged into the crowd's output groups later)."""

    task: ShardTask
    respondents: int
    respondents_deleted: int
    bucket_bits: int


class BucketPiece(NamedTuple):
    """Surviving messages of one shard that drew one bucket."""

    bucket: int
    bucket_bits: int
    piece: Piece


class ReleasedGroup(NamedTuple):
    """Messages of one crowd released together, in their release order (one output file).

    Only fields a ShuffledMessage carries: no origin, event time or instance.
    """

    window_start: int
    window_end: int
    channel: str
    recipe_id: str
    crowd_id: str | None
    payloads: pa.Array
    crcs: np.ndarray

    @property
    def messages(self) -> int:
        return len(self.payloads)


@dataclass(frozen=True)
class ShuffleConfig:
    """Parameters of one shuffler run (instance ``rules.instance``, or all instances keyed apart).

    ``crowd_threshold``: smallest number of distinct respondents a crowd is released with;
    ``deletion``: (eps_cr, delta_cr) of Algorithm 3, or None for no randomized deletion;
    ``window``: event-time windows; ``streaming``: late panes are expected (watermark);
    ``batch_records``: records per column batch read; ``messages_per_shard``: target size of an
    origin shard; ``messages_per_file``: target number of messages per output file (the number of
    random groups of a crowd is a power of two chosen from its released message count only).
    """

    rules: core.ValidationRules
    crowd_threshold: int = 100
    deletion: core.DeletionParameters | None = None
    window: core.WindowSpec = field(default_factory=core.WindowSpec)
    streaming: bool = False
    batch_records: int = avro_io.DEFAULT_BATCH_RECORDS
    messages_per_shard: int = 200_000
    messages_per_file: int = 200_000

    def __post_init__(self) -> None:
        if not isinstance(self.rules, core.ValidationRules):
            raise ValueError(f"rules must be ValidationRules, got {type(self.rules).__name__}")
        for name in (
            "crowd_threshold",
            "batch_records",
            "messages_per_shard",
            "messages_per_file",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.deletion is not None and not isinstance(self.deletion, core.DeletionParameters):
            raise ValueError("deletion must be DeletionParameters or None")
        if not isinstance(self.window, core.WindowSpec):
            raise ValueError("window must be a WindowSpec")


# ---------------------------------------------------------------------------------------------
# Spill files (Arrow IPC): written once, read by the shards and groups that need their rows
# ---------------------------------------------------------------------------------------------


def _spill_path(spill_dir: str, kind: str) -> str:
    return FileSystems.join(spill_dir, kind, f"{secrets.token_hex(16)}.arrow")


# Spill files hold record batch messages of one of these schemas (no schema message: readers
# know it), one after another, so that a piece is read with one seek and one read.
REPORT_SPILL_SCHEMA = pa.schema(
    [
        ("origin_hash", pa.uint64()),
        ("origin", pa.string()),
        ("event_time", pa.int64()),
        ("min_crowd_size", pa.int64()),
        ("payload", pa.binary()),
        ("payload_crc32c", pa.int64()),
        ("record_index", pa.int64()),
    ]
)
RELEASED_SPILL_SCHEMA = pa.schema([("payload", pa.binary()), ("payload_crc32c", pa.int64())])
PIECE_LIST_SCHEMA = pa.schema(
    [(name, pa.string() if name in ("path", "source") else pa.int64()) for name in Piece._fields]
)
# A shard's rows are copied out of the pieces read for it whenever the pieces held reach this
# many bytes, so memory follows the shard's size, not its crowd's.
_COMPACT_BYTES = 16 << 20


def write_spill(path: str, batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    """Write record batches to a new spill file at ``path`` as consecutive Arrow IPC record
    batch messages; returns each one's ``(offset, length)`` in the file."""
    positions = []
    offset = 0
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for batch in batches:
            message = batch.serialize()
            handle.write(memoryview(message))
            positions.append((offset, message.size))
            offset += message.size
    return positions


def read_spill(piece: Piece, schema: pa.Schema) -> pa.RecordBatch:
    """The record batch a piece points to (one seek and one read of its bytes)."""
    if FileSystems.get_scheme(piece.path) is None:
        with open(piece.path, "rb", buffering=0) as handle:
            handle.seek(piece.offset)
            data = handle.read(piece.length)
    else:
        with FileSystems.open(piece.path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(piece.offset)
            data = handle.read(piece.length)
    if len(data) != piece.length:
        raise RuntimeError(f"spill file {piece.path} is shorter than expected")
    return pa.ipc.read_record_batch(pa.py_buffer(data), schema)


def write_piece_list(spill_dir: str, pieces: tuple[Piece, ...]) -> Piece:
    """Spill a crowd's pieces (one row each); returns the pointer to the list."""
    columns = [
        pa.array([getattr(piece, name) for piece in pieces], type=field.type)
        for name, field in zip(Piece._fields, PIECE_LIST_SCHEMA, strict=True)
    ]
    path = _spill_path(spill_dir, "crowds")
    ((offset, length),) = write_spill(
        path, [pa.RecordBatch.from_arrays(columns, schema=PIECE_LIST_SCHEMA)]
    )
    return Piece(
        path, offset, length, len(pieces), "", max((p.min_crowd for p in pieces), default=0)
    )


def read_piece_list(piece_list: Piece) -> list[Piece]:
    """The pieces :func:`write_piece_list` spilled."""
    batch = read_spill(piece_list, PIECE_LIST_SCHEMA)
    columns = [batch.column(name).to_pylist() for name in Piece._fields]
    return [Piece(*values) for values in zip(*columns, strict=True)]


def read_shard_rows(task: ShardTask, columns: Iterable[str]) -> pa.Table:
    """The rows of one origin shard from every piece of its crowd (only ``columns``)."""
    columns = list(columns)
    compacted: list[pa.Table] = []
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    for piece in read_piece_list(task.piece_list):
        batch = read_spill(piece, REPORT_SPILL_SCHEMA)
        hashes = batch.column("origin_hash").to_numpy()
        begin, end = core.shard_row_range(hashes, task.shard, task.bits)
        if end > begin:
            held.append(batch.slice(begin, end - begin).select(columns))
            held_bytes += piece.length
        if held_bytes >= _COMPACT_BYTES:
            compacted.append(pa.Table.from_batches(held).combine_chunks())
            held, held_bytes = [], 0
    if held:
        compacted.append(pa.Table.from_batches(held).combine_chunks())
    if not compacted:
        return REPORT_SPILL_SCHEMA.empty_table().select(columns)
    return pa.concat_tables(compacted)


# ---------------------------------------------------------------------------------------------
# Counting helpers
# ---------------------------------------------------------------------------------------------


def _counter(name: str) -> Any:
    return Metrics.counter(METRICS_NAMESPACE, name.replace(":", "_"))


def _count(counts: dict[str, int], name: str, value: int) -> None:
    if value:
        counts[name] = counts.get(name, 0) + int(value)
        _counter(name).inc(int(value))


def metrics_summary(counts: Mapping[str, int]) -> dict[str, Any]:
    """metrics.json: read, rejected by reason, released, deleted, withheld, and the balance check
    read = released + deleted + withheld + dead-lettered, in records (DESIGN.md invariant 5); it
    fails when some unreadable chunk held an unknown number of records."""
    rejected = {
        name[len(REJECTED_PREFIX) :]: value
        for name, value in sorted(counts.items())
        if name.startswith(REJECTED_PREFIX)
    }
    unknown = {
        name[len(UNKNOWN_PREFIX) :]: value
        for name, value in sorted(counts.items())
        if name.startswith(UNKNOWN_PREFIX)
    }
    read = int(counts.get(READ, 0))
    released = int(counts.get(RELEASED, 0))
    deleted = int(counts.get(DELETED, 0))
    withheld = int(counts.get(WITHHELD, 0))
    dead_lettered = sum(rejected.values())
    accounted = released + deleted + withheld + dead_lettered
    return {
        "read": read,
        "rejected_by_reason": rejected,
        "dead_lettered": dead_lettered,
        "released": released,
        "deleted": deleted,
        "withheld": withheld,
        "crowds_released": int(counts.get("crowds_released", 0)),
        "crowds_withheld": int(counts.get("crowds_withheld", 0)),
        "accounted": accounted,
        "chunks_of_unknown_records": unknown,
        "adds_up": read == accounted and not unknown,
    }


# ---------------------------------------------------------------------------------------------
# Step 1: read, validate, window, hash, spill
# ---------------------------------------------------------------------------------------------


class _PieceOutput(NamedTuple):
    key: CrowdKey
    piece: Piece


def spill_valid_rows(
    batch: pa.RecordBatch,
    source: str,
    first_record: int,
    config: ShuffleConfig,
    hash_key: np.ndarray,
    spill_dir: str,
) -> list[_PieceOutput]:
    """Window, hash, sort and spill the valid rows of one batch; one pointer per crowd."""
    if batch.num_rows == 0:
        return []
    window_start = core.window_starts(
        batch.column("event_time").to_numpy(zero_copy_only=False), config.window
    )
    hashes = core.origin_hashes(batch.column("origin"), hash_key)
    key_columns = [
        pa.array(window_start),
        batch.column("shuffler_instance"),
        batch.column("channel"),
        batch.column("recipe_id"),
        batch.column("crowd_id"),
    ]
    order, starts = core.group_rows_by_hash(key_columns, hashes)
    take = pa.array(order)
    ordered = pa.RecordBatch.from_arrays(
        [pa.array(hashes[order], type=pa.uint64())]
        + [
            batch.column(name).take(take).cast(REPORT_SPILL_SCHEMA.field(name).type)
            for name in _SPILL_COLUMNS
        ]
        + [pa.array(order.astype(np.int64) + first_record)],
        schema=REPORT_SPILL_SCHEMA,
    )
    min_crowd = ordered.column("min_crowd_size").to_numpy()
    path = _spill_path(spill_dir, "reports")
    slices = []
    bounds = []
    instance = batch.column("shuffler_instance")
    channel = batch.column("channel")
    recipe = batch.column("recipe_id")
    crowd = batch.column("crowd_id")
    for begin, end in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        row = int(order[begin])
        key: CrowdKey = (
            int(window_start[row]),
            int(instance[row].as_py()),
            channel[row].as_py(),
            recipe[row].as_py(),
            crowd[row].as_py(),
        )
        slices.append(ordered.slice(begin, end - begin))
        bounds.append((key, end - begin, int(min_crowd[begin:end].max())))
    positions = write_spill(path, slices)
    return [
        _PieceOutput(key, Piece(path, offset, length, rows, source, min_crowd_size))
        for (key, rows, min_crowd_size), (offset, length) in zip(bounds, positions, strict=True)
    ]


@beam.typehints.with_output_types(typing.Any)
class ReadValidateSpill(beam.DoFn):
    """Path -> timestamped (crowd key, Piece) pointers; tagged dead letters and counts."""

    def __init__(self, config: ShuffleConfig, hash_key: np.ndarray, spill_dir: str) -> None:
        self._config = config
        self._hash_key = hash_key
        self._spill_dir = spill_dir

    def process(self, path: str) -> Iterator[Any]:
        expect = schema_json("report")  # a file that does not resolve to it: schema_mismatch
        for item in avro_io.read_avro_batches(path, self._config.batch_records, expect):
            counts: dict[str, int] = {}
            if isinstance(item, avro_io.UnreadableChunk):
                if item.records is None:
                    _count(counts, UNKNOWN_PREFIX + item.reason, 1)
                _count(counts, READ, item.records or 0)
                _count(counts, REJECTED_PREFIX + item.reason, item.records or 0)
                letter = item.dead_letter(STAGE_READ)
                yield beam.pvalue.TaggedOutput("dead_letter", [letter])
                yield beam.pvalue.TaggedOutput("counts", counts)
                continue
            yield from self._process_batch(item, counts)

    def _process_batch(self, item: avro_io.ColumnBatch, counts: dict[str, int]) -> Iterator[Any]:
        batch = item.columns
        _count(counts, READ, batch.num_rows)
        reasons = core.validate_reports(batch, self._config.rules)
        rejected = np.flatnonzero(reasons != core.VALID)
        if rejected.size:
            letters = []
            problem = core.schema_problem(batch.schema)
            rejected_records = batch.take(pa.array(rejected)).to_pylist()
            for row, record in zip(rejected.tolist(), rejected_records, strict=True):
                reason = core.REASONS[reasons[row]]
                detail = problem if reason == "wrong_schema" and problem else None
                letters.append(
                    dead_letter(
                        STAGE_VALIDATE,
                        reason,
                        detail or core.rejection_detail(reason, record, self._config.rules),
                        f"{item.source}#record={item.first_record + row}",
                        original_record=record,
                    )
                )
            codes, per_code = np.unique(reasons[rejected], return_counts=True)
            for code, number in zip(codes.tolist(), per_code.tolist(), strict=True):
                _count(counts, REJECTED_PREFIX + core.REASONS[code], number)
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
            valid = np.flatnonzero(reasons == core.VALID)
            batch = batch.take(pa.array(valid))
        yield beam.pvalue.TaggedOutput("counts", counts)
        pieces = spill_valid_rows(
            batch, item.source, item.first_record, self._config, self._hash_key, self._spill_dir
        )
        for key, piece in pieces:
            timestamp = Timestamp(micros=key[0] * 1000)
            yield beam_window.TimestampedValue((key, piece), timestamp)


# ---------------------------------------------------------------------------------------------
# Steps 2-3: crowds, shards, distinct respondents
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class PlanShards(beam.DoFn):
    """(crowd, pointers) -> one ShardTask per origin shard; a late pane goes to ``late``."""

    def __init__(self, config: ShuffleConfig, spill_dir: str) -> None:
        self._config = config
        self._spill_dir = spill_dir

    def process(
        self, element: tuple[CrowdKey, Iterable[Piece]], pane_info=beam.DoFn.PaneInfoParam
    ) -> Iterator[Any]:
        key, pieces = element
        pieces = tuple(sorted(pieces))
        if pane_info is not None and pane_info.timing == PaneInfoTiming.LATE:
            yield beam.pvalue.TaggedOutput("late", (key, pieces))
            return
        messages = sum(piece.rows for piece in pieces)
        bits = core.split_bits(messages, self._config.messages_per_shard)
        piece_list = write_piece_list(self._spill_dir, pieces)
        for shard in range(1 << bits):
            yield key, ShardTask(shard, bits, piece_list, piece_list.min_crowd)


@beam.typehints.with_output_types(tuple[typing.Any, typing.Any])
class CountShard(beam.DoFn):
    """(crowd, ShardTask) -> (crowd, ShardCount): exact distinct origins of one shard."""

    def process(self, element: tuple[CrowdKey, ShardTask]) -> Iterator[tuple[CrowdKey, ShardCount]]:
        key, task = element
        rows = read_shard_rows(task, ["origin"])
        respondents = core.count_distinct(rows.column("origin")) if rows.num_rows else 0
        yield key, ShardCount(task, respondents, rows.num_rows)


# ---------------------------------------------------------------------------------------------
# Step 4: threshold and randomized deletion per crowd
# ---------------------------------------------------------------------------------------------


def manifest_record(
    key: CrowdKey,
    window_end: int,
    decision: core.CrowdDecision,
    messages_in: int,
    messages_deleted: int,
    messages_released: int,
) -> dict[str, Any]:
    """A CrowdManifest (``schemas/manifest.avsc``) for one crowd."""
    window_start, instance, channel, recipe_id, crowd_id = key
    return {
        "window_start": window_start,
        "window_end": window_end,
        "shuffler_instance": instance,
        "channel": channel,
        "recipe_id": recipe_id,
        "crowd_id": crowd_id,
        "respondents": decision.respondents,
        "messages_in": messages_in,
        "threshold": decision.threshold,
        "status": decision.status,
        "withheld_reason": decision.withheld_reason,
        "respondents_deleted": decision.respondents_deleted,
        "messages_deleted": messages_deleted,
        "messages_released": messages_released,
    }


@beam.typehints.with_output_types(typing.Any)
class Decide(beam.DoFn):
    """(crowd, shard counts) -> DeletionTasks; tagged manifests (withheld crowds, final) or
    manifest drafts (released crowds, completed with message counts later) and counts."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[CrowdKey, Iterable[ShardCount]]) -> Iterator[Any]:
        key, shard_counts = element
        shard_counts = sorted(shard_counts, key=lambda count: count.task.shard)
        respondents = sum(count.respondents for count in shard_counts)
        messages = sum(count.messages for count in shard_counts)
        route = self._config.rules.routes.get(key[3])
        message_minimum = shard_counts[0].task.min_crowd
        threshold = core.crowd_threshold(
            self._config.crowd_threshold, route.min_crowd_size if route else 0, message_minimum
        )
        decision = core.decide_crowd(respondents, threshold, self._config.deletion, self._source)
        window_end = key[0] + self._config.window.period_ms
        counts: dict[str, int] = {}
        if decision.status == core.WITHHELD:
            _count(counts, WITHHELD, messages)
            _count(counts, "crowds_withheld", 1)
            yield beam.pvalue.TaggedOutput("counts", counts)
            yield beam.pvalue.TaggedOutput(
                "manifest", manifest_record(key, window_end, decision, messages, 0, 0)
            )
            return
        _count(counts, "crowds_released", 1)
        yield beam.pvalue.TaggedOutput("counts", counts)
        per_shard = np.array([count.respondents for count in shard_counts], dtype=np.int64)
        deleted = core.split_deletions(per_shard, decision.respondents_deleted, self._source)
        # Enough buckets for the largest release possible (every message kept); the group count
        # is chosen later from the released count, which the analyzer sees anyway.
        bucket_bits = core.split_bits(messages, self._config.messages_per_file)
        yield beam.pvalue.TaggedOutput(
            "draft", (key, manifest_record(key, window_end, decision, messages, 0, 0))
        )
        for count, shard_deleted in zip(shard_counts, deleted.tolist(), strict=True):
            if count.messages:
                yield (
                    key,
                    DeletionTask(count.task, count.respondents, int(shard_deleted), bucket_bits),
                )


# ---------------------------------------------------------------------------------------------
# Steps 5-6: delete, strip, scatter to random groups; permute each group
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class DeleteAndScatter(beam.DoFn):
    """(crowd, DeletionTask) -> (crowd, BucketPiece) for surviving messages, stripped to payload
    and CRC, each in a fresh uniform bucket; tagged per-crowd message counts ``stats``."""

    def __init__(self, spill_dir: str) -> None:
        self._spill_dir = spill_dir
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[CrowdKey, DeletionTask]) -> Iterator[Any]:
        key, deletion = element
        rows = read_shard_rows(deletion.task, ["origin", "payload", "payload_crc32c"])
        encoded = rows.column("origin").combine_chunks().dictionary_encode()
        distinct = len(encoded.dictionary)
        if distinct != deletion.respondents:
            raise RuntimeError(
                f"shard {deletion.task.shard} of {key} has {distinct} origins, counted "
                f"{deletion.respondents}: spill files changed during the run"
            )
        origin_codes = encoded.indices.to_numpy(zero_copy_only=False)
        kept = core.kept_rows(origin_codes, distinct, deletion.respondents_deleted, self._source)
        survivors = np.flatnonzero(kept)
        messages_deleted = rows.num_rows - survivors.size
        counts: dict[str, int] = {}
        _count(counts, DELETED, messages_deleted)
        yield beam.pvalue.TaggedOutput("counts", counts)
        yield beam.pvalue.TaggedOutput("stats", (key, (messages_deleted, int(survivors.size))))
        if not survivors.size:
            return
        groups = core.assign_groups(survivors.size, 1 << deletion.bucket_bits, self._source)
        order = survivors[np.argsort(groups, kind="stable")]
        sorted_groups = np.sort(groups)
        take = pa.array(order)
        released = pa.RecordBatch.from_arrays(
            [
                rows.column("payload").combine_chunks().take(take),
                rows.column("payload_crc32c").combine_chunks().take(take),
            ],
            schema=RELEASED_SPILL_SCHEMA,
        )
        starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
        ends = np.r_[starts[1:], sorted_groups.size]
        bounds = list(zip(starts.tolist(), ends.tolist(), strict=True))
        path = _spill_path(self._spill_dir, "released")
        positions = write_spill(path, [released.slice(b, e - b) for b, e in bounds])
        for (begin, end), (offset, length) in zip(bounds, positions, strict=True):
            piece = Piece(path, offset, length, end - begin, "", 0)
            yield key, BucketPiece(int(sorted_groups[begin]), deletion.bucket_bits, piece)


@beam.typehints.with_output_types(ReleasedGroup)
class PermuteGroup(beam.DoFn):
    """((crowd, group), pieces) -> ReleasedGroup in uniformly random order (secure)."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[tuple[CrowdKey, int], tuple[Piece, ...]]) -> Iterator[Any]:
        (key, _group), pieces = element
        batches = [read_spill(piece, RELEASED_SPILL_SCHEMA) for piece in pieces]
        table = pa.Table.from_batches(batches, schema=RELEASED_SPILL_SCHEMA)
        order = pa.array(core.release_order(table.num_rows, self._source))
        payloads = table.column("payload").combine_chunks().take(order)
        crcs = table.column("payload_crc32c").combine_chunks().take(order).to_numpy()
        counts: dict[str, int] = {}
        _count(counts, RELEASED, table.num_rows)
        yield beam.pvalue.TaggedOutput("counts", counts)
        window_start, _instance, channel, recipe_id, crowd_id = key
        yield ReleasedGroup(
            window_start,
            window_start + self._config.window.period_ms,
            channel,
            recipe_id,
            crowd_id,
            payloads,
            crcs,
        )


# ---------------------------------------------------------------------------------------------
# Late data and manifests
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class LateToDeadLetter(beam.DoFn):
    """Pointers of a late pane -> dead letters ``late_data`` with the full original records."""

    def process(self, element: tuple[CrowdKey, tuple[Piece, ...]]) -> Iterator[Any]:
        key, pieces = element
        window_start, instance, channel, recipe_id, crowd_id = key
        counts: dict[str, int] = {}
        for piece in pieces:
            batch = read_spill(piece, REPORT_SPILL_SCHEMA)
            letters = []
            for row in batch.to_pylist():
                record = {
                    "schema_version": SCHEMA_VERSION,
                    "shuffler_instance": instance,
                    "channel": channel,
                    "recipe_id": recipe_id,
                    "crowd_id": crowd_id,
                    "min_crowd_size": row["min_crowd_size"],
                    "origin": row["origin"],
                    "event_time": row["event_time"],
                    "payload": row["payload"],
                    "payload_crc32c": row["payload_crc32c"],
                }
                letters.append(
                    dead_letter(
                        STAGE_WINDOW,
                        core.LATE_DATA,
                        f"arrived after window [{window_start}, ...) was released",
                        f"{piece.source}#record={row['record_index']}",
                        original_record=record,
                    )
                )
            _count(counts, REJECTED_PREFIX + core.LATE_DATA, len(letters))
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
        yield beam.pvalue.TaggedOutput("counts", counts)


@beam.typehints.with_output_types(typing.Any)
class CompleteCrowd(beam.DoFn):
    """(crowd, {draft, stats, buckets}) -> ((crowd, group), pieces) per output group; the crowd's
    final manifest goes to ``manifest``.

    The crowd gets 2**g groups, g from its released message count (visible to the analyzer
    anyway); buckets are merged into groups by contiguous ranges, so every message's group is
    uniform and independent of everything else.
    """

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config

    def process(self, element: tuple[CrowdKey, dict[str, list[Any]]]) -> Iterator[Any]:
        key, joined = element
        deleted = sum(stat[0] for stat in joined["stats"])
        released = sum(stat[1] for stat in joined["stats"])
        for draft in joined["draft"]:
            manifest = dict(draft)
            manifest["messages_deleted"] = deleted
            manifest["messages_released"] = released
            yield beam.pvalue.TaggedOutput("manifest", manifest)
        buckets: list[BucketPiece] = sorted(joined["buckets"])
        if not buckets:
            return
        bucket_bits = buckets[0].bucket_bits
        group_bits = min(bucket_bits, core.split_bits(released, self._config.messages_per_file))
        groups: dict[int, list[Piece]] = {}
        for bucket in buckets:
            group = int(core.group_of_bucket(np.array([bucket.bucket]), bucket_bits, group_bits)[0])
            groups.setdefault(group, []).append(bucket.piece)
        for group, pieces in sorted(groups.items()):
            yield (key, group), tuple(pieces)


class ShuffleOutputs(NamedTuple):
    released: beam.PCollection  # ReleasedGroup
    manifests: beam.PCollection  # CrowdManifest dicts
    dead_letters: beam.PCollection  # lists of DeadLetter dicts
    counts: beam.PCollection  # dicts of counts (sum them: read = released + deleted + ...)


class ShuffleReports(beam.PTransform):
    """PCollection of report file paths -> :class:`ShuffleOutputs` (see the module docstring)."""

    def __init__(self, config: ShuffleConfig, spill_dir: str) -> None:
        super().__init__()
        self._config = config
        self._spill_dir = spill_dir
        # The shard hash key is secret per run: senders cannot aim their origins at one shard.
        self._hash_key = core.new_origin_hash_key(os_random_source())

    def _windowing(self) -> beam.WindowInto:
        fixed = beam_window.FixedWindows(
            size=Duration(micros=self._config.window.period_ms * 1000),
            offset=Timestamp(micros=self._config.window.offset_ms * 1000),
        )
        if not self._config.streaming:
            return beam.WindowInto(fixed)
        return beam.WindowInto(
            fixed,
            trigger=beam_trigger.AfterWatermark(late=beam_trigger.AfterCount(1)),
            accumulation_mode=beam_trigger.AccumulationMode.DISCARDING,
            allowed_lateness=_UNBOUNDED_LATENESS,
        )

    def expand(self, paths: beam.PCollection) -> ShuffleOutputs:
        config = self._config
        read = paths | "ReadValidateSpill" >> beam.ParDo(
            ReadValidateSpill(config, self._hash_key, self._spill_dir)
        ).with_outputs("dead_letter", "counts", main="pieces")
        planned = (
            read.pieces
            | "WindowByEventTime" >> self._windowing()
            | "GroupByCrowd" >> beam.GroupByKey()
            | "PlanShards"
            >> beam.ParDo(PlanShards(config, self._spill_dir)).with_outputs("late", main="shards")
        )
        late = planned.late | "LateToDeadLetter" >> beam.ParDo(LateToDeadLetter()).with_outputs(
            "dead_letter", "counts"
        )
        decided = (
            planned.shards
            | "SpreadShards" >> beam.Reshuffle()
            | "CountShard" >> beam.ParDo(CountShard())
            | "GroupShardCounts" >> beam.GroupByKey()
            | "Decide"
            >> beam.ParDo(Decide(config)).with_outputs("manifest", "draft", "counts", main="tasks")
        )
        scattered = (
            decided.tasks
            | "SpreadDeletions" >> beam.Reshuffle()
            | "DeleteAndScatter"
            >> beam.ParDo(DeleteAndScatter(self._spill_dir)).with_outputs(
                "stats", "counts", main="pieces"
            )
        )
        completed = (
            {"draft": decided.draft, "stats": scattered.stats, "buckets": scattered.pieces}
            | "GroupByCrowdAgain" >> beam.CoGroupByKey()
            | "CompleteCrowd"
            >> beam.ParDo(CompleteCrowd(config)).with_outputs("manifest", main="groups")
        )
        permuted = (
            completed.groups
            | "SpreadGroups" >> beam.Reshuffle()
            | "PermuteGroup"
            >> beam.ParDo(PermuteGroup(config)).with_outputs("counts", main="released")
        )
        manifests = (decided.manifest, completed.manifest) | "Manifests" >> beam.Flatten()
        dead_letters = (
            read.dead_letter
            | "DeadLettersToGlobal" >> beam.WindowInto(beam_window.GlobalWindows()),
            late.dead_letter | "LateToGlobal" >> beam.WindowInto(beam_window.GlobalWindows()),
        ) | "DeadLetters" >> beam.Flatten()
        counts = [
            read.counts,
            late.counts,
            decided.counts,
            scattered.counts,
            permuted.counts,
        ]
        counts = [
            pcoll | f"CountsToGlobal{index}" >> beam.WindowInto(beam_window.GlobalWindows())
            for index, pcoll in enumerate(counts)
        ] | "Counts" >> beam.Flatten()
        return ShuffleOutputs(permuted.released, manifests, dead_letters, counts)


# ---------------------------------------------------------------------------------------------
# Sinks
# ---------------------------------------------------------------------------------------------


def shuffled_columns(group: ReleasedGroup) -> dict[str, Any]:
    """ShuffledMessage columns of a released group (constants for the crowd's fields)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "window_start": group.window_start,
        "window_end": group.window_end,
        "channel": group.channel,
        "recipe_id": group.recipe_id,
        "crowd_id": group.crowd_id,
        "payload": group.payloads,
        "payload_crc32c": group.crcs,
    }


def shuffled_records(group: ReleasedGroup) -> Iterator[dict[str, Any]]:
    """ShuffledMessage records of a released group, in release order."""
    common = {
        "schema_version": SCHEMA_VERSION,
        "window_start": group.window_start,
        "window_end": group.window_end,
        "channel": group.channel,
        "recipe_id": group.recipe_id,
        "crowd_id": group.crowd_id,
    }
    for payload, crc in zip(group.payloads.to_pylist(), group.crcs.tolist(), strict=True):
        record = dict(common)
        record["payload"] = payload
        record["payload_crc32c"] = crc
        yield record


def message_file_path(output_dir: str, group: ReleasedGroup) -> str:
    """DIR/messages/window_start=<ms>/channel=<name>/part-<random>.avro (random file name)."""
    channel = urllib.parse.quote(group.channel, safe="")
    return FileSystems.join(
        output_dir,
        "messages",
        f"window_start={group.window_start}",
        f"channel={channel}",
        f"part-{secrets.token_hex(16)}.avro",
    )


class WriteShuffledMessages(beam.PTransform):
    """ReleasedGroup -> one ShuffledMessage Avro file each; outputs the file paths."""

    def __init__(self, output_dir: str, codec: str = "null") -> None:
        super().__init__()
        self._output_dir = output_dir
        self._codec = codec

    def expand(self, released: beam.PCollection) -> beam.PCollection:
        output_dir, codec = self._output_dir, self._codec

        def write(group: ReleasedGroup) -> str:
            path = message_file_path(output_dir, group)
            avro_io.write_avro_columns(
                path,
                schema_json("shuffled_message"),
                shuffled_columns(group),
                group.messages,
                codec,
            )
            return path

        return released | "WriteMessageFile" >> beam.Map(write)


class WriteDeadLetters(beam.PTransform):
    """Lists of dead letters -> DIR/dead_letter/part-<random>.avro files."""

    def __init__(self, output_dir: str) -> None:
        super().__init__()
        self._output_dir = output_dir

    def expand(self, letters: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir

        def write(batch: list[dict[str, Any]]) -> str:
            path = FileSystems.join(output_dir, "dead_letter", f"part-{secrets.token_hex(16)}.avro")
            avro_io.write_avro(path, parsed_schema("dead_letter"), batch)
            return path

        return letters | "WriteDeadLetterFile" >> beam.Map(write)


class WriteManifests(beam.PTransform):
    """CrowdManifest dicts -> DIR/manifest.avro (batch: one file when all crowds are decided).

    In streaming mode each window's manifests go to
    DIR/manifest/window_start=<ms>/part-<random>.avro as the window is released.
    """

    def __init__(self, output_dir: str, streaming: bool = False) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._streaming = streaming

    def expand(self, manifests: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir
        schema = parsed_schema("manifest")
        if self._streaming:

            def write_window(element: tuple[int, Iterable[dict[str, Any]]]) -> str:
                window_start, records = element
                path = FileSystems.join(
                    output_dir,
                    "manifest",
                    f"window_start={window_start}",
                    f"part-{secrets.token_hex(16)}.avro",
                )
                avro_io.write_avro(path, schema, _sorted_manifests(records))
                return path

            return (
                manifests
                | "KeyByWindow" >> beam.Map(lambda record: (record["window_start"], record))
                | "GroupByWindow" >> beam.GroupByKey()
                | "WriteManifestWindow" >> beam.Map(write_window)
            )

        def write_all(records: list[dict[str, Any]]) -> str:
            path = FileSystems.join(output_dir, "manifest.avro")
            avro_io.write_avro(path, schema, _sorted_manifests(records))
            return path

        return (
            manifests
            | "ManifestsToGlobal" >> beam.WindowInto(beam_window.GlobalWindows())
            | "AllManifests" >> beam.combiners.ToList()
            | "WriteManifestFile" >> beam.Map(write_all)
        )


def _sorted_manifests(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    def order(record: dict[str, Any]) -> tuple[Any, ...]:
        return (
            record["window_start"],
            record["shuffler_instance"],
            record["channel"],
            record["recipe_id"],
            record["crowd_id"] or "",
        )

    return sorted(records, key=order)


class WriteMetrics(beam.PTransform):
    """Count dicts -> DIR/metrics.json (:func:`metrics_summary`).

    Streaming mode rewrites the file with the running totals after every update.
    """

    def __init__(self, output_dir: str, streaming: bool = False) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._streaming = streaming

    def expand(self, counts: beam.PCollection) -> beam.PCollection:
        output_dir = self._output_dir

        def write(total: dict[str, int]) -> dict[str, Any]:
            summary = metrics_summary(total)
            path = FileSystems.join(output_dir, "metrics.json")
            with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                handle.write(json.dumps(summary, indent=2, sort_keys=True).encode())
            return summary

        if self._streaming:
            counts = counts | "RunningTotals" >> beam.WindowInto(
                beam_window.GlobalWindows(),
                trigger=beam_trigger.Repeatedly(beam_trigger.AfterCount(1)),
                accumulation_mode=beam_trigger.AccumulationMode.ACCUMULATING,
            )
        combine = beam.CombineGlobally(SumCounts())
        if self._streaming:
            combine = combine.without_defaults()
        return counts | "SumCounts" >> combine | "WriteMetricsFile" >> beam.Map(write)
