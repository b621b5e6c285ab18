"""The ESA shuffler as Beam transforms (esa-privacy-revisited, Sections II-C and V).

``ShuffleReports`` takes a PCollection of Avro report file paths and returns the released groups,
the crowd tables, the crowd manifests, the dead letters and the counts. The unit of work is the
crowd bucket ``BucketKey(window_start, instance, crowd_bucket(channel, recipe, crowd ID, B))``
(``schemas/release/crowd_buckets.py``), never the crowd: many crowds share one element through every
grouping, one set of files and one commit entry (issue: memory and element counts flat in the
number of crowds). Inside an element that crosses a grouping a bucket's crowds are a few bytes
objects, never a Python object per crowd: key texts as one zlib'd blob (``pack_texts``), counts
and decisions as zlib'd int64 arrays (``pack_ints``), unpacked by the consuming DoFn, because
FnApiRunner holds a grouping's values decoded, and encoded twice more, until the next stage ran. Each step is a thin
DoFn over column batches; the row work is in ``shuffle_core`` (validation, windows, hashes) and
``shuffle_steps``, the release decisions in ``release_core`` (pure, injected randomness), the
spill format in ``shuffle_spill``:

1. ``ReadReportFile``: a file, or a range of its blocks (``read.PlanReportRanges``, when the
   pipeline is spread over processes), in fastavro blocks (``avro_io``) -> column batches;
   unreadable bytes -> ``UnreadableToDeadLetter`` (counted in records when the block header says
   how many).
2. ``ValidateBatch``: every record checked (``shuffle_core.validate_reports``); rejected ones
   dead-lettered with their reason.
3. ``SpillBatch``: event-time windows, keyed origin hashes, the bucket of each DISTINCT crowd,
   sort by (bucket, hash), drop the plaintext origin, spill (one Arrow IPC stream per bucket,
   each row naming its crowd in a dictionary column) and emit one pointer per (bucket, batch),
   timestamped with its window.
4. Window by event time; group pointers by bucket; ``PlanShards`` splits a bucket into 2**b
   origin shards by hash range from its message count, so one huge crowd still spreads over
   workers (late panes are dead-lettered ``late_data``: nothing is dropped). A shard reads only
   the chunks of each spill piece its hash range touches (the piece's fences,
   ``spill.read_shard_range``): a bucket's shards together read it about once, however many.
5. ``CountShard``: screens each origin's messages per crowd (one presence message counts, the
   data messages up to the crowd's recipe's per-origin cap; the rest dead-lettered) and counts
   distinct origins per crowd: one element per shard with per-crowd arrays. The data messages
   that pass are spilled once more as the shard's candidates (payload, CRC, crowd and the
   origin's rank in its crowd), so the shard's report rows are read and screened once.
6. ``Decide``: per crowd of the bucket, threshold and Algorithm 3 on distinct respondents;
   deletions split over shards per crowd. ``DeleteAndScatter``: read the shard's candidates, delete
   whole respondents (by origin rank), scatter survivors over uniform slots. ``CompleteBucket``: the bucket's manifests and crowd table, slots -> 2**g groups from
   the bucket's released count. ``PermuteGroup``: rows grouped by crowd in ``crowd_order``, a
   uniform permutation within each crowd, one released file per group (these three in
   ``shuffle_release``).

The origin-hash key (issue: secrets stay off the job graph) is not drawn while the graph is
built: ``DrawOriginKey`` draws it from the operating system's CSPRNG on a worker, inside the
pipeline, and ``SpillBatch`` receives it as a singleton side input. It is never pickled into the
job, never written to a file by us, and the runner keeps it only as the side input of this run
(a retried bundle of the draw is committed once, so every worker sees the same key). The key only
spreads origins over shards and hides them in spill files: nothing released depends on it.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms import trigger as beam_trigger
from apache_beam.transforms import window as beam_window
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming

from privacy.noise import os_random_source
from schemas.release.crowd_buckets import BucketKey, crowd_order
from transforms.shuffler import decide, report_rows, spill
from transforms.shuffler.bundles import CountsBundles
from transforms.shuffler.config import (  # noqa: F401 - re-exported names of this stage
    BUNDLES_PREFIX,
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
from transforms.shuffler.read import (
    ReadReportFile,
    SpillBatch,
    UnreadableToDeadLetter,
    ValidateBatch,
    draw_origin_key,
)
from transforms.shuffler.release import (
    RELEASED_COLUMNS,
    CompleteBucket,
    DeleteAndScatter,
    PermuteGroup,
)
from transforms.shuffler.replays import bucket_repeats, shard_repeat_keys, shard_repeats
from transforms.shuffler.sinks import CrowdTable, ReleasedGroup  # noqa: F401 - re-exported
from transforms.shuffler.spill import (
    Piece,
    crowd_of_text,
    pack_ints,
    pack_texts,
    unpack_ints,
    unpack_texts,
)
from transforms.shuffler.steps import (
    DRAFT_COLUMNS,
    draft_row,
    screen,
    spilled_dead_letters,
)
from transforms.shuffler.steps import count as _count

# Allowed lateness in streaming: effectively unbounded, so Beam never drops a late element
# silently; late panes are dead-lettered by PlanShards instead.
_UNBOUNDED_LATENESS = Duration(seconds=100 * 365 * 86_400)


# ---------------------------------------------------------------------------------------------
# Steps 4-5: buckets, shards, screening and distinct respondents per crowd
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class PlanShards(beam.DoFn):
    """(bucket, pointers) -> one ShardTask per origin shard; a late pane goes to ``late``."""

    def __init__(self, config: ShuffleConfig, spill_dir: str) -> None:
        self._config = config
        self._spill_dir = spill_dir

    def process(
        self, element: tuple[BucketKey, Iterable[Piece]], pane_info=beam.DoFn.PaneInfoParam
    ) -> Iterator[Any]:
        key, pieces = element
        pieces = tuple(sorted(pieces))
        if pane_info is not None and pane_info.timing == PaneInfoTiming.LATE:
            yield beam.pvalue.TaggedOutput("late", (key, pieces))
            return
        messages = sum(piece.rows for piece in pieces)
        # A bucket (even of one huge crowd) spreads over 2**bits shards by origin hash, each
        # reading about shard_piece_rows rows (or messages_per_shard, if fewer) or more of every
        # piece (config.SHARD_PIECE_ROWS), and over every worker where it is large enough.
        config = self._config
        bits = decide.origin_shard_bits(messages, len(pieces), config.messages_per_shard,
                                        config.shard_piece_rows, config.workers)  # fmt: skip
        piece_list = spill.write_piece_list(self._spill_dir, pieces)
        # Replays across shards, found once for the bucket (replays.py); one shard finds its own.
        repeats = bucket_repeats(list(pieces)) if bits else None
        for shard in range(1 << bits):
            own = shard_repeat_keys(repeats, shard, bits) if bits else b""
            yield key, spill.ShardTask(shard, bits, piece_list, own)


_SHARD_COLUMNS = [
    "origin_hash",
    "event_time",
    "min_crowd_size",
    "payload",
    "payload_crc32c",
    "record_index",
    "crowd",
]


_SCREEN_DETAILS = {
    decide.DUPLICATE_PRESENCE: "a second presence message from one origin in this crowd",
    decide.DUPLICATE_PAYLOAD: "a repeat of a sealed payload already in this crowd (a replay)",
}


def _over_cap_detail(caps: dict[str, int]) -> Any:
    return lambda text: f"more than {caps[text]} data messages from one origin in this crowd"


@beam.typehints.with_output_types(typing.Any)
class CountShard(CountsBundles):
    """(bucket, ShardTask) -> (bucket, ShardCount) with per-crowd arrays; screened-out messages
    are dead-lettered and presence messages counted (``presence``). The data messages that pass
    are spilled once as the shard's candidates (payload, CRC, crowd, origin code), which is all
    ``DeleteAndScatter`` reads: a shard's rows are read and screened once."""

    def __init__(self, rules: report_rows.ValidationRules, spill_dir: str) -> None:
        self._rules = rules
        self._spill_dir = spill_dir
        self._files = spill.OpenSpill()

    def start_bundle(self) -> None:
        super().start_bundle()
        self._files.close()  # any a failed bundle left open

    def finish_bundle(self) -> None:
        # The bundle's shards share the files of their buckets' pieces; none stays open after.
        self._files.close()
        super().finish_bundle()

    def teardown(self) -> None:
        self._files.close()

    def process(self, element: tuple[BucketKey, spill.ShardTask]) -> Iterator[Any]:
        self.worked()
        key, task = element
        rows, sources = spill.read_shard_rows(task, _SHARD_COLUMNS, self._files)
        repeats = (
            shard_repeats(
                task.repeats,
                rows.column(spill.PIECE_INDEX).to_numpy(),
                rows.column("record_index").to_numpy(),
            )
            if task.bits
            else None
        )  # across the bucket's shards
        screened = screen(rows, self._rules, key[1], repeats)
        codes, crowds, texts = screened.codes, screened.crowds, screened.texts
        counts: dict[str, int] = {}
        _count(counts, PRESENCE, int(np.count_nonzero(codes == decide.PRESENCE)))
        caps = dict(zip(texts, screened.caps.tolist(), strict=True))
        for code, reason in decide.SCREEN_REASONS.items():
            flagged = np.flatnonzero(codes == code)
            if not flagged.size:
                continue
            detail = _SCREEN_DETAILS.get(code) or _over_cap_detail(caps)
            letters = spilled_dead_letters(
                key, rows.take(pa.array(flagged)), sources, STAGE_SCREEN, reason, detail
            )
            _count(counts, REJECTED_PREFIX + reason, flagged.size)
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
        yield beam.pvalue.TaggedOutput("counts", counts)
        if not rows.num_rows:
            return
        # A repeated sealed payload counts nobody: its sender is a respondent only by messages
        # of its own (schemas/replays.py).
        counted = np.flatnonzero(codes != decide.DUPLICATE_PAYLOAD)
        data = np.flatnonzero(codes == decide.DATA)
        messages = np.bincount(crowds[data], minlength=len(texts))
        min_crowd = np.zeros(len(texts), dtype=np.int64)
        minimums = rows.column("min_crowd_size").to_numpy()[counted]
        np.maximum.at(min_crowd, crowds[counted], minimums)
        yield (
            key,
            spill.ShardCount(
                task,
                pack_texts(texts),
                pack_ints(screened.respondents),
                pack_ints(messages),
                pack_ints(min_crowd),
                self._candidates(rows, data, screened.origins[data]),
            ),
        )

    def _candidates(
        self, rows: pa.Table, chosen: np.ndarray, origin: np.ndarray
    ) -> spill.Piece | None:
        """Spill the rows ``chosen`` (data messages that passed screening, in row order) with
        their origin codes; the pointer, or None when there are none."""
        if not chosen.size:
            return None
        take = pa.array(chosen)
        batch = pa.RecordBatch.from_arrays(
            [rows.column(name).combine_chunks().take(take) for name in RELEASED_COLUMNS]
            + [pa.array(origin)],
            schema=spill.CANDIDATE_SPILL_SCHEMA,
        )
        path = spill.spill_path(self._spill_dir, "candidates")
        ((offset, length, _),) = spill.write_spill(path, [batch])
        return Piece(path, offset, length, batch.num_rows, "", 0)


# ---------------------------------------------------------------------------------------------
# Step 6: threshold and randomized deletion per crowd, delete and scatter, groups, permutation
# ---------------------------------------------------------------------------------------------


@beam.typehints.with_output_types(typing.Any)
class Decide(beam.DoFn):
    """(bucket, shard counts) -> DeletionTasks per shard; the bucket's draft (its crowds'
    decisions, completed into manifests with message counts later) tagged ``draft``; counts."""

    def __init__(self, config: ShuffleConfig) -> None:
        self._config = config
        self._source: Any = None

    def setup(self) -> None:
        self._source = os_random_source()

    def process(self, element: tuple[BucketKey, Iterable[spill.ShardCount]]) -> Iterator[Any]:
        key, shard_counts = element
        shard_counts = sorted(shard_counts, key=lambda count: count.task.shard)
        shard_texts = [unpack_texts(count.crowds) for count in shard_counts]
        position: dict[str, int] = {}
        for texts in shard_texts:
            for text in texts:
                position.setdefault(text, len(position))
        crowds = len(position)
        respondents = np.zeros((len(shard_counts), crowds), dtype=np.int64)
        messages = np.zeros(crowds, dtype=np.int64)
        min_crowd = np.zeros(crowds, dtype=np.int64)
        for row, count in enumerate(shard_counts):
            columns = np.array([position[text] for text in shard_texts[row]], dtype=np.int64)
            respondents[row, columns] = unpack_ints(count.respondents)
            messages[columns] += unpack_ints(count.messages)
            np.maximum.at(min_crowd, columns, unpack_ints(count.min_crowd))
        names = {text: crowd_of_text(text) for text in position}  # each key parsed once
        texts = sorted(position, key=lambda text: crowd_order(*names[text]))
        window_end = key[0] + self._config.window.period_ms
        deleted = np.zeros_like(respondents)
        released = np.zeros(crowds, dtype=bool)
        decisions = np.zeros((crowds, len(DRAFT_COLUMNS)), dtype=np.int64)
        crowd_respondents = respondents.sum(axis=0)
        withheld_messages = withheld_crowds = 0
        for index, text in enumerate(texts):
            column = position[text]
            route = self._config.rules.routes.get(names[text][1])
            threshold = decide.crowd_threshold(
                self._config.crowd_threshold,
                route.min_crowd_size if route else 0,
                int(min_crowd[column]),
            )
            decision = decide.decide_crowd(
                int(crowd_respondents[column]), threshold, self._config.deletion, self._source
            )
            decisions[index] = draft_row(decision, int(messages[column]))
            if decision.status == decide.WITHHELD:
                withheld_messages += int(messages[column])
                withheld_crowds += 1
                continue
            released[column] = True
            if decision.respondents_deleted:  # none deleted: no draw, nothing to split
                deleted[:, column] = decide.split_deletions(
                    respondents[:, column], decision.respondents_deleted, self._source
                )
        # counted once per bucket (a Beam counter per crowd cost more than the decision)
        counts: dict[str, int] = {}
        _count(counts, WITHHELD, withheld_messages)
        _count(counts, "crowds_withheld", withheld_crowds)
        _count(counts, "crowds_released", crowds - withheld_crowds)
        yield beam.pvalue.TaggedOutput("counts", counts)
        # Enough slots for the largest release possible (every message kept); the group count
        # is chosen later from the released count, which the analyzer sees anyway.
        slot_bits = decide.split_bits(int(messages[released].sum()), self._config.messages_per_file)
        yield beam.pvalue.TaggedOutput(
            "draft",
            (
                key,
                spill.BucketDraft(window_end, slot_bits, pack_texts(texts), pack_ints(decisions)),
            ),
        )
        for row, count in enumerate(shard_counts):
            chosen = [
                text
                for text in shard_texts[row]
                if released[position[text]] and respondents[row, position[text]]
            ]
            if not chosen:
                continue
            columns = np.array([position[text] for text in chosen], dtype=np.int64)
            yield (
                key,
                spill.DeletionTask(
                    count.task,
                    pack_texts(chosen),
                    pack_ints(respondents[row, columns]),
                    pack_ints(deleted[row, columns]),
                    slot_bits,
                    count.candidates,
                ),
            )


@beam.typehints.with_output_types(typing.Any)
class LateToDeadLetter(beam.DoFn):
    """Pointers of a late pane -> dead letters ``late_data`` for every spilled row."""

    def process(self, element: tuple[BucketKey, tuple[Piece, ...]]) -> Iterator[Any]:
        key, pieces = element
        counts: dict[str, int] = {}
        detail = f"arrived after window [{key[0]}, ...) was released"
        for piece in pieces:
            rows = spill.read_spill(piece, spill.REPORT_SPILL_SCHEMA)
            letters = spilled_dead_letters(
                key, rows, piece.source, STAGE_WINDOW, report_rows.LATE_DATA, detail
            )
            _count(counts, REJECTED_PREFIX + report_rows.LATE_DATA, len(letters))
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
        yield beam.pvalue.TaggedOutput("counts", counts)


class ShuffleOutputs(NamedTuple):
    released: beam.PCollection  # ReleasedGroup (one message file each)
    crowds: beam.PCollection  # CrowdTable (one crowd table file per bucket)
    manifests: beam.PCollection  # (BucketKey, CrowdManifest rows: manifest_row tuples)
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
            SpillBatch(config.window, spill_dir, config.crowd_buckets),
            beam.pvalue.AsSingleton(hash_key),
        )
        planned = (
            pieces
            | "WindowByEventTime" >> self._windowing()
            | "GroupByBucket" >> beam.GroupByKey()
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
            >> beam.ParDo(CountShard(rules, spill_dir)).with_outputs(
                "dead_letter", "counts", main="counted"
            )
        )
        decided = (
            counted.counted
            | "GroupShardCounts" >> beam.GroupByKey()
            | "Decide" >> beam.ParDo(Decide(config)).with_outputs("draft", "counts", main="tasks")
        )
        scattered = (
            decided.tasks
            | "SpreadDeletions" >> beam.Reshuffle()
            | "DeleteAndScatter"
            >> beam.ParDo(DeleteAndScatter(spill_dir)).with_outputs("counts", main="shards")
        )
        completed = (
            {"draft": decided.draft, "shards": scattered.shards}
            | "GroupByBucketAgain" >> beam.CoGroupByKey()
            | "CompleteBucket"
            >> beam.ParDo(CompleteBucket(config)).with_outputs("manifest", "crowds", main="groups")
        )
        permuted = (
            completed.groups
            | "SpreadGroups" >> beam.Reshuffle()
            | "PermuteGroup"
            >> beam.ParDo(PermuteGroup(config)).with_outputs("counts", main="released")
        )
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
        return ShuffleOutputs(
            permuted.released, completed.crowds, completed.manifest, dead_letters, counts
        )
