"""The ESA shuffler as Beam transforms (esa-privacy-revisited, Sections II-C and V).

``ShuffleReports`` takes a PCollection of Avro report file paths and returns the released groups,
the crowd manifests, the dead letters and the counts. Each step is a thin DoFn over column
batches; the row work is in ``shuffle_core`` (validation, windows, hashes), the release decisions
in ``release_core`` (pure, injected randomness), the spill format in ``shuffle_spill``:

1. ``ReadReportFile``: a file in fastavro blocks (``avro_io``) -> column batches; unreadable
   bytes -> ``UnreadableToDeadLetter`` (counted in records when the block header says how many).
2. ``ValidateBatch``: every record checked (``shuffle_core.validate_reports``); rejected ones
   dead-lettered with their reason.
3. ``SpillBatch``: event-time windows, keyed origin hashes, sort by (crowd, hash), drop the
   plaintext origin, spill (one Arrow IPC message per crowd) and emit one pointer per (crowd,
   batch), timestamped with its window.
4. Window by event time; group pointers by crowd = (window, instance, channel, recipe, crowd ID);
   ``PlanShards`` splits a crowd into 2**b origin shards by hash range (late panes are
   dead-lettered ``late_data``: nothing is dropped).
5. ``CountShard``: screens each origin's messages (one presence message counts, the data messages
   up to the recipe's per-origin cap; the rest dead-lettered) and counts distinct origins.
6. ``Decide``: threshold and Algorithm 3 per crowd on distinct respondents; deletions split over
   shards. ``DeleteAndScatter``: delete whole respondents, strip everything but payload and CRC,
   drop presence messages, scatter survivors over uniform buckets. ``CompleteCrowd``: buckets ->
   2**g groups. ``PermuteGroup``: a uniform permutation per group, one released file per group.

The origin-hash key (issue: secrets stay off the job graph) is not drawn while the graph is
built: ``DrawOriginKey`` draws it from the operating system's CSPRNG on a worker, inside the
pipeline, and ``SpillBatch`` receives it as a singleton side input. It is never pickled into the
job, never written to a file by us, and the runner keeps it only as the side input of this run
(a retried bundle of the draw is committed once, so every worker sees the same key). The key only
spreads origins over shards and hides them in spill files: nothing released depends on it.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms import trigger as beam_trigger
from apache_beam.transforms import window as beam_window
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming

from privacy.noise import os_random_source
from transforms import release_core as decide
from transforms import shuffle_core as core
from transforms import shuffle_spill as spill
from transforms.shuffle_config import (  # noqa: F401 - re-exported names of this stage
    DELETED,
    METRICS_NAMESPACE,
    PRESENCE,
    READ,
    REJECTED_PREFIX,
    RELEASED,
    STAGE_READ,
    STAGE_SCREEN,
    STAGE_VALIDATE,
    STAGE_WINDOW,
    UNKNOWN_PREFIX,
    WITHHELD,
    ShuffleConfig,
    metrics_summary,
)
from transforms.shuffle_read import (
    ReadReportFile,
    SpillBatch,
    UnreadableToDeadLetter,
    ValidateBatch,
    draw_origin_key,
)
from transforms.shuffle_sinks import (  # noqa: F401 - re-exported: pipelines/analyze.py uses it
    ReleasedGroup,
    WriteDeadLetters,
)
from transforms.shuffle_spill import CrowdKey, Piece
from transforms.shuffle_steps import count as _count
from transforms.shuffle_steps import (
    manifest_dict,
    manifest_record,
    manifest_row,
    origin_cap,
    screen,
    spilled_dead_letters,
)

# Allowed lateness in streaming: effectively unbounded, so Beam never drops a late element
# silently; late panes are dead-lettered by PlanShards instead.
_UNBOUNDED_LATENESS = Duration(seconds=100 * 365 * 86_400)


# ---------------------------------------------------------------------------------------------
# Steps 4-5: crowds, shards, screening and distinct respondents
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
        bits = decide.split_bits(messages, self._config.messages_per_shard)
        piece_list = spill.write_piece_list(self._spill_dir, pieces)
        for shard in range(1 << bits):
            yield key, spill.ShardTask(shard, bits, piece_list, piece_list.min_crowd)


_SHARD_COLUMNS = [
    "origin_hash",
    "event_time",
    "min_crowd_size",
    "payload",
    "payload_crc32c",
    "record_index",
]


@beam.typehints.with_output_types(typing.Any)
class CountShard(beam.DoFn):
    """(crowd, ShardTask) -> (crowd, ShardCount); screened-out messages are dead-lettered and
    presence messages counted (``presence``)."""

    def __init__(self, rules: core.ValidationRules) -> None:
        self._rules = rules

    def process(self, element: tuple[CrowdKey, spill.ShardTask]) -> Iterator[Any]:
        key, task = element
        rows, sources = spill.read_shard_rows(task, _SHARD_COLUMNS)
        codes = screen(rows, self._rules, key)
        counts: dict[str, int] = {}
        _count(counts, PRESENCE, int(np.count_nonzero(codes == decide.PRESENCE)))
        cap = origin_cap(self._rules, key)
        for code, reason in decide.SCREEN_REASONS.items():
            flagged = np.flatnonzero(codes == code)
            if not flagged.size:
                continue
            detail = (
                f"more than {cap} data messages from one origin in this crowd"
                if code == decide.OVER_ORIGIN_CAP
                else "a second presence message from one origin in this crowd"
            )
            letters = spilled_dead_letters(
                key, rows.take(pa.array(flagged)), sources, STAGE_SCREEN, reason, detail
            )
            _count(counts, REJECTED_PREFIX + reason, flagged.size)
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
        yield beam.pvalue.TaggedOutput("counts", counts)
        respondents = core.count_distinct(rows.column("origin_hash")) if rows.num_rows else 0
        yield key, spill.ShardCount(task, respondents, int(np.count_nonzero(codes == decide.DATA)))


# ---------------------------------------------------------------------------------------------
# Step 6: threshold and randomized deletion per crowd, delete and scatter, groups, permutation
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class Decide(beam.DoFn):
    """(crowd, shard counts) -> DeletionTasks; tagged manifests (withheld crowds, final) or
    manifest drafts (released crowds, completed with message counts later) and counts."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[CrowdKey, Iterable[spill.ShardCount]]) -> Iterator[Any]:
        key, shard_counts = element
        shard_counts = sorted(shard_counts, key=lambda count: count.task.shard)
        respondents = sum(count.respondents for count in shard_counts)
        messages = sum(count.messages for count in shard_counts)
        route = self._config.rules.routes.get(key[3])
        threshold = decide.crowd_threshold(
            self._config.crowd_threshold,
            route.min_crowd_size if route else 0,
            shard_counts[0].task.min_crowd,
        )
        decision = decide.decide_crowd(respondents, threshold, self._config.deletion, self._source)
        window_end = key[0] + self._config.window.period_ms
        counts: dict[str, int] = {}
        manifest = manifest_row(manifest_record(key, window_end, decision, messages, 0, 0))
        if decision.status == decide.WITHHELD:
            _count(counts, WITHHELD, messages)
            _count(counts, "crowds_withheld", 1)
            yield beam.pvalue.TaggedOutput("counts", counts)
            yield beam.pvalue.TaggedOutput("manifest", manifest)
            return
        _count(counts, "crowds_released", 1)
        yield beam.pvalue.TaggedOutput("counts", counts)
        per_shard = np.array([count.respondents for count in shard_counts], dtype=np.int64)
        deleted = decide.split_deletions(per_shard, decision.respondents_deleted, self._source)
        # Enough buckets for the largest release possible (every message kept); the group count
        # is chosen later from the released count, which the analyzer sees anyway.
        bucket_bits = decide.split_bits(messages, self._config.messages_per_file)
        yield beam.pvalue.TaggedOutput("draft", (key, manifest))
        for count, shard_deleted in zip(shard_counts, deleted.tolist(), strict=True):
            if count.respondents:
                task = spill.DeletionTask(
                    count.task, count.respondents, int(shard_deleted), bucket_bits
                )
                yield key, task


@beam.typehints.with_output_types(typing.Any)
class DeleteAndScatter(beam.DoFn):
    """(crowd, DeletionTask) -> (crowd, BucketPiece) for surviving data messages, stripped to
    payload and CRC, each in a fresh uniform bucket; tagged per-crowd message counts ``stats``."""

    def __init__(self, rules: core.ValidationRules, spill_dir: str) -> None:
        self._rules = rules
        self._spill_dir = spill_dir
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[CrowdKey, spill.DeletionTask]) -> Iterator[Any]:
        key, deletion = element
        rows, _ = spill.read_shard_rows(deletion.task, ["origin_hash", "payload", "payload_crc32c"])
        codes = screen(rows, self._rules, key)
        distinct, origin_codes = np.unique(
            rows.column("origin_hash").to_numpy(), return_inverse=True
        )
        if distinct.size != deletion.respondents:
            raise RuntimeError(
                f"shard {deletion.task.shard} of {key} has {distinct.size} origins, counted "
                f"{deletion.respondents}: spill files changed during the run"
            )
        kept = decide.kept_rows(
            origin_codes, distinct.size, deletion.respondents_deleted, self._source
        )
        data = codes == decide.DATA
        survivors = np.flatnonzero(kept & data)
        messages_deleted = int(np.count_nonzero(~kept & data))
        counts: dict[str, int] = {}
        _count(counts, DELETED, messages_deleted)
        yield beam.pvalue.TaggedOutput("counts", counts)
        stats = (messages_deleted, int(survivors.size))
        yield beam.pvalue.TaggedOutput("stats", (key, stats))
        if not survivors.size:
            return
        buckets = decide.assign_groups(survivors.size, 1 << deletion.bucket_bits, self._source)
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        take = pa.array(survivors[order])
        released = pa.RecordBatch.from_arrays(
            [
                rows.column("payload").combine_chunks().take(take),
                rows.column("payload_crc32c").combine_chunks().take(take),
            ],
            schema=spill.RELEASED_SPILL_SCHEMA,
        )
        starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]])
        bounds = list(
            zip(starts.tolist(), np.r_[starts[1:], sorted_buckets.size].tolist(), strict=True)
        )
        path = spill.spill_path(self._spill_dir, "released")
        positions = spill.write_spill(path, [released.slice(b, e - b) for b, e in bounds])
        for (begin, end), (offset, length) in zip(bounds, positions, strict=True):
            piece = Piece(path, offset, length, end - begin, "", 0)
            yield key, spill.BucketPiece(int(sorted_buckets[begin]), deletion.bucket_bits, piece)


@beam.typehints.with_output_types(typing.Any)
class CompleteCrowd(beam.DoFn):
    """(crowd, {draft, stats, buckets}) -> ((crowd, group), pieces) per output group
    (``release_core.complete_groups``); the crowd's final manifest goes to ``manifest``."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config

    def process(self, element: tuple[CrowdKey, Mapping[str, list[Any]]]) -> Iterator[Any]:
        key, joined = element
        deleted = sum(stat[0] for stat in joined["stats"])
        released = sum(stat[1] for stat in joined["stats"])
        for draft in joined["draft"]:
            manifest = manifest_dict(draft)
            manifest["messages_deleted"] = deleted
            manifest["messages_released"] = released
            yield beam.pvalue.TaggedOutput("manifest", manifest_row(manifest))
        buckets: list[spill.BucketPiece] = sorted(joined["buckets"])
        if not buckets:
            return
        groups = decide.complete_groups(
            [bucket.bucket for bucket in buckets],
            buckets[0].bucket_bits,
            released,
            self._config.messages_per_file,
        )
        for group, indices in groups.items():
            yield (key, group), tuple(buckets[index].piece for index in indices)


@beam.typehints.with_output_types(typing.Any)
class PermuteGroup(beam.DoFn):
    """((crowd, group), pieces) -> ReleasedGroup in uniformly random order (secure)."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[tuple[CrowdKey, int], tuple[Piece, ...]]) -> Iterator[Any]:
        (key, group), pieces = element
        batches = [spill.read_spill(piece, spill.RELEASED_SPILL_SCHEMA) for piece in pieces]
        table = pa.Table.from_batches(batches, schema=spill.RELEASED_SPILL_SCHEMA)
        order = pa.array(decide.release_order(table.num_rows, self._source))
        counts: dict[str, int] = {}
        _count(counts, RELEASED, table.num_rows)
        yield beam.pvalue.TaggedOutput("counts", counts)
        yield ReleasedGroup(
            key,
            group,
            key[0] + self._config.window.period_ms,
            table.column("payload").combine_chunks().take(order),
            table.column("payload_crc32c").combine_chunks().take(order).to_numpy(),
        )


@beam.typehints.with_output_types(typing.Any)
class LateToDeadLetter(beam.DoFn):
    """Pointers of a late pane -> dead letters ``late_data`` for every spilled row."""

    def process(self, element: tuple[CrowdKey, tuple[Piece, ...]]) -> Iterator[Any]:
        key, pieces = element
        counts: dict[str, int] = {}
        detail = f"arrived after window [{key[0]}, ...) was released"
        for piece in pieces:
            rows = spill.read_spill(piece, spill.REPORT_SPILL_SCHEMA)
            letters = spilled_dead_letters(
                key, rows, piece.source, STAGE_WINDOW, core.LATE_DATA, detail
            )
            _count(counts, REJECTED_PREFIX + core.LATE_DATA, len(letters))
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
        yield beam.pvalue.TaggedOutput("counts", counts)


class ShuffleOutputs(NamedTuple):
    released: beam.PCollection  # ReleasedGroup
    manifests: beam.PCollection  # CrowdManifest rows (shuffle_steps.manifest_row tuples)
    dead_letters: beam.PCollection  # lists of DeadLetter dicts
    counts: beam.PCollection  # dicts of counts (sum them: metrics_summary)


class ShuffleReports(beam.PTransform):
    """PCollection of report file paths -> :class:`ShuffleOutputs` (see the module docstring)."""

    def __init__(self, config: ShuffleConfig, spill_dir: str) -> None:
        super().__init__()
        self._config = config
        self._spill_dir = spill_dir

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
        config, spill_dir, rules = self._config, self._spill_dir, self._config.rules
        hash_key = (
            paths.pipeline
            | "OriginKeySeed" >> beam.Create([None])
            | "DrawOriginKey" >> beam.Map(draw_origin_key)
        )
        read = paths | "ReadReportFile" >> beam.ParDo(
            ReadReportFile(config.batch_records)
        ).with_outputs("unreadable", main="batches")
        unreadable = read.unreadable | "UnreadableToDeadLetter" >> beam.ParDo(
            UnreadableToDeadLetter()
        ).with_outputs("dead_letter", "counts")
        valid = read.batches | "ValidateBatch" >> beam.ParDo(ValidateBatch(rules)).with_outputs(
            "dead_letter", "counts", main="valid"
        )
        pieces = valid.valid | "SpillBatch" >> beam.ParDo(
            SpillBatch(config.window, spill_dir), beam.pvalue.AsSingleton(hash_key)
        )
        planned = (
            pieces
            | "WindowByEventTime" >> self._windowing()
            | "GroupByCrowd" >> beam.GroupByKey()
            | "PlanShards"
            >> beam.ParDo(PlanShards(config, spill_dir)).with_outputs("late", main="shards")
        )
        late = planned.late | "LateToDeadLetter" >> beam.ParDo(LateToDeadLetter()).with_outputs(
            "dead_letter", "counts"
        )
        counted = (
            planned.shards
            | "SpreadShards" >> beam.Reshuffle()
            | "CountShard"
            >> beam.ParDo(CountShard(rules)).with_outputs("dead_letter", "counts", main="counted")
        )
        decided = (
            counted.counted
            | "GroupShardCounts" >> beam.GroupByKey()
            | "Decide"
            >> beam.ParDo(Decide(config)).with_outputs("manifest", "draft", "counts", main="tasks")
        )
        scattered = (
            decided.tasks
            | "SpreadDeletions" >> beam.Reshuffle()
            | "DeleteAndScatter"
            >> beam.ParDo(DeleteAndScatter(rules, spill_dir)).with_outputs(
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
        letters = [unreadable.dead_letter, valid.dead_letter, late.dead_letter, counted.dead_letter]
        dead_letters = [
            pcoll | f"DeadLettersToGlobal{index}" >> beam.WindowInto(beam_window.GlobalWindows())
            for index, pcoll in enumerate(letters)
        ] | "DeadLetters" >> beam.Flatten()
        counts = [
            unreadable.counts,
            valid.counts,
            late.counts,
            counted.counts,
            decided.counts,
            scattered.counts,
            permuted.counts,
        ]
        counts = [
            pcoll | f"CountsToGlobal{index}" >> beam.WindowInto(beam_window.GlobalWindows())
            for index, pcoll in enumerate(counts)
        ] | "Counts" >> beam.Flatten()
        return ShuffleOutputs(permuted.released, manifests, dead_letters, counts)
