"""The analyzer's second half as Beam transforms: count arrays per crowd bucket in, answers out.

:class:`EstimateBuckets` de-biases, bucket by bucket, each crowd's count arrays with its recipe's estimator at the
effective respondent count n_eff = Σ_u π_u n_u (``transforms.analyzer.arithmetic``: the respondents
each instance's commit record states it released, weighted by the recipe's instance weights),
adds standard errors, the optional labelled post-processing, the longitudinal marginals of Algorithm 2
(amplification-by-shuffling) with Theorem 6's bound, the privacy report per crowd, and, when a
simulation's truth is given, the accuracy against it; a bucket's histogram crowds of one recipe
are de-biased together, as the rows of one matrix (:class:`EstimateBucket`). :class:`WriteAnalysis` writes
``histograms.parquet/`` and ``longitudinal.parquet/`` (Parquet datasets written part by part,
``transforms.analyzer.tables``), ``reports.jsonl/`` and ``withheld.jsonl/`` (JSON Lines, part by
part, ``transforms.analyzer.report_files``) and ``summary.json`` (totals only).

Outputs leave per crowd bucket (``transforms.analyzer.arithmetic.buckets``): a bucket's rows as a few
Arrow tables, its reports and notes as compressed JSON Lines, to the part its key hashes to;
never one element per crowd (pictures aside: at most a few dozen crowds) nor per message.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import pickle
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from privacy import accounting
from transforms.analyzer import arithmetic
from transforms.analyzer.aggregate import metrics_summary
from transforms.analyzer.report_files import (
    REPORTS_DIR,
    WITHHELD_DIR,
    HistogramReportLines,
    WindowCrowd,
    WriteLineBatches,
    estimated_crowds,
    histogram_report_orders,
    json_line,
    json_ready,
    note_order,
    pack_lines,
    report_order,
    report_totals,
)
from transforms.analyzer.tables import (
    ROWS_PER_BATCH,
    SPILL_FILE_BYTES,
    WriteParts,
    WriteTableBatches,
    concat_compact,
    histogram_rows_table,
    histogram_schema,
    histogram_table,
    longitudinal_schema,
    longitudinal_table,
    pack_table,
    shard_of,
    spill_batches,
)
from transforms.common import avro_io
from transforms.common.combiners import SumCounts

HISTOGRAMS_FILE = "histograms.parquet"
LONGITUDINAL_FILE = "longitudinal.parquet"
SUMMARY_FILE = "summary.json"
HISTOGRAM_TAG = "histogram"
LONGITUDINAL_TAG = "longitudinal"
PICTURE_TAG = "picture"
REPORT_TAG = "report"
NOTE_TAG = "note"


@dataclass(frozen=True)
class TruthSource:
    """Where a simulation's truth is (``truth.parquet``) and which recipe it describes."""

    path: str
    recipe_id: str

    def __post_init__(self) -> None:
        if not self.path or not self.recipe_id:
            raise ValueError("TruthSource needs a path and a recipe_id")


def read_truth(source: TruthSource) -> arithmetic.Truth:
    """``truth.parquet`` of ``esa simulate`` (window_start, bucket, count) as a Truth."""
    with avro_io.open_input(source.path) as handle:
        table = pq.read_table(handle, columns=["window_start", "bucket", "count"])
    window_start = table.column("window_start")
    if pa.types.is_timestamp(window_start.type):
        window_start = window_start.cast(pa.timestamp("ms")).cast(pa.int64())
    return arithmetic.Truth(
        recipe_id=source.recipe_id,
        window_start=window_start.to_numpy(),
        bucket=table.column("bucket").to_numpy(),
        count=table.column("count").to_numpy(),
    )


@dataclass(frozen=True)
class AnalysisConfig:
    """Settings of the estimation step.

    ``deletion``: per shuffler instance, the (ε_cr, δ_cr) of its randomized deletion (Algorithm
    3, esa-privacy-revisited) as its commit record states them, added to the privacy report;
    ``pictured``: the crowd keys whose (report, table) go to the ``pictures`` output; ``failure_probability``: β of the
    longitudinal error bound; ``truth``: simulations' truth files, at most one per recipe.
    """

    book: arithmetic.RecipeBook
    postprocessing: str = "none"
    failure_probability: float = 0.05
    deletion: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    truth: tuple[TruthSource, ...] = ()
    pictured: frozenset = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.book, arithmetic.RecipeBook) or len(self.book) == 0:
            raise ValueError("book must be a non-empty RecipeBook")
        if self.postprocessing not in arithmetic.POSTPROCESSING:
            raise ValueError(
                f"postprocessing must be one of {arithmetic.POSTPROCESSING}, got {self.postprocessing!r}"
            )
        if not 0 < self.failure_probability < 1:
            raise ValueError(
                f"failure_probability must be in (0, 1), got {self.failure_probability}"
            )
        deletion = {}
        for instance, pair in dict(self.deletion).items():
            epsilon, delta = (float(v) for v in pair)
            if not (epsilon > 0 and math.isfinite(epsilon) and 0 < delta < 1):
                raise ValueError(f"deletion for instance {instance} must be (ε > 0, δ in (0, 1))")
            deletion[int(instance)] = (epsilon, delta)
        object.__setattr__(self, "deletion", deletion)
        truth = tuple(self.truth)
        recipes = [source.recipe_id for source in truth]
        if len(set(recipes)) != len(recipes):
            raise ValueError(f"one truth per recipe, got {recipes}")
        object.__setattr__(self, "truth", truth)
        object.__setattr__(self, "pictured", frozenset(self.pictured))

    @property
    def postprocessed_column(self) -> str | None:
        return None if self.postprocessing == "none" else f"estimate_{self.postprocessing}"


class RowGroup(NamedTuple):
    """Histogram crowds of one recipe that :meth:`CrowdEstimator.estimate_rows` de-biases
    together: their positions in the bucket, keys, dense bucket sums (one row each), n_eff,
    respondents per instance, messages and rejected counts."""

    recipe: Any
    randomizer: Any
    positions: list[int]
    keys: list[arithmetic.CrowdKey]
    sums: list[np.ndarray] | np.ndarray
    respondents: list[float]
    by_instance: list[dict[int, int]]
    messages: list[int] | np.ndarray
    rejected: list[dict[str, int] | None]


def _add_to_group(
    groups: dict[str, RowGroup], recipe_id: str, recipe: Any, randomizer: Any, crowd: tuple
) -> None:
    """Append one crowd (position, key, sums, n_eff, respondents per instance, messages,
    rejected) to its recipe's :class:`RowGroup` in ``groups``, made at the recipe's first."""
    group = groups.get(recipe_id)
    if group is None:
        group = groups[recipe_id] = RowGroup(recipe, randomizer, *([] for _ in range(7)))
    for column, value in zip(group[2:], crowd, strict=True):
        column.append(value)


class BucketCrowds(NamedTuple):
    """A bucket's crowds as :meth:`CrowdEstimator.bucket_crowds` splits them: the estimated
    ones' keys in :func:`arithmetic.crowd_sort_key` order (their positions), the row groups,
    the positions that go one by one, the notes on the crowds all of whose messages were
    rejected, and the accumulator of a position (made when asked)."""

    keys: list[arithmetic.CrowdKey]
    groups: list[RowGroup]
    single: list[int]
    rejected_notes: list[dict[str, Any]]
    accumulator: Callable[[int], arithmetic.Accumulator]


class RowEstimates(NamedTuple):
    """What :meth:`CrowdEstimator.estimate_rows` makes of a :class:`RowGroup`: the report lines
    of the estimated crowds (with their positions; as ``HistogramReportLines.pieces``), one table of their rows, the (report, table)
    of the pictured ones, and the positions the one-crowd path must take (their estimate was
    refused: it says why)."""

    positions: list[int]
    lines: tuple[list[str], list[str], list[str]]  # HistogramReportLines.pieces
    table: pa.Table
    pictures: list[tuple[dict[str, Any], pa.Table]]
    refused: list[int]


# n_eff values kept per (recipe, respondents per instance) by an estimator (emptied when full).
_RESPONDENTS_LIMIT = 4096


class CrowdEstimator:
    """Estimates crowds: ``estimate(key, accumulator)`` one at a time -> ``(report, table)``
    pairs (one per histogram crowd, one per round of a longitudinal crowd; ``table`` None when
    there is no estimate); :meth:`row_groups` and :meth:`estimate_rows` many histogram crowds of
    one recipe at once, with the same numbers, tables and report lines. Reads the simulations'
    truth once (:meth:`setup`)."""

    def __init__(self, config: AnalysisConfig) -> None:
        self._config = config
        self._truth: dict[str, arithmetic.Truth] = {}
        self._schema = histogram_schema(config)
        self._randomizers: dict[str, Any] = {}
        self._respondents: dict[tuple, float | None] = {}
        self._lines = HistogramReportLines(config.deletion)

    def setup(self) -> None:
        self._truth = {source.recipe_id: read_truth(source) for source in self._config.truth}

    def _truth_for(self, key: arithmetic.CrowdKey) -> arithmetic.Truth | None:
        truth = self._truth.get(key[4])
        return truth if truth is not None and truth.applies_to(key) else None

    def estimate(
        self, key: arithmetic.CrowdKey, accumulator: arithmetic.Accumulator | None
    ) -> list[tuple[dict[str, Any], pa.Table | None]]:
        recipe = self._config.book.get(key[4])
        if recipe is None or accumulator is None:  # aggregate_batch only keys known recipes
            return []
        if isinstance(accumulator, arithmetic.LongitudinalAccumulator):
            return self._longitudinal(recipe, key, accumulator)
        return [self._histogram(recipe, key, accumulator)]

    def _histogram(
        self, recipe: Any, key: arithmetic.CrowdKey, accumulator: arithmetic.CrowdAccumulator
    ) -> tuple[dict[str, Any], pa.Table | None]:
        config = self._config
        try:
            result = arithmetic.estimate_histogram(recipe, key, accumulator, config.postprocessing)
        except ValueError as error:
            report = arithmetic.key_fields(key)
            report.update(
                respondents_by_instance={str(u): c for u, c in accumulator.respondents.items()},
                messages=accumulator.messages,
                notes=[f"no estimate: {error}"],
            )
            return report, None
        truth_dense = accuracy = None
        truth = self._truth_for(key)
        if truth is not None:
            buckets, counts = truth.window(key[1])
            accuracy = arithmetic.histogram_accuracy(result, buckets, counts)
            keys, values = arithmetic.sparse_truth(buckets, counts)
            truth_dense = arithmetic.values_at(result.buckets, keys, values)
        table = histogram_table(result, config, truth_dense, self._schema)
        report = arithmetic.histogram_report(
            recipe, result, config.deletion, accuracy, accumulator.rejected
        )
        return report, table

    def _row_randomizer(self, recipe_id: str, recipe: Any) -> Any | None:
        """The recipe's randomizer when its crowds can be de-biased as rows (built once)."""
        randomizer = self._randomizers.get(recipe_id, False)
        if randomizer is False:
            randomizer = recipe.build_randomizer()
            if not arithmetic.estimates_rows(randomizer):
                randomizer = None
            self._randomizers[recipe_id] = randomizer
        return randomizer

    def _effective(self, recipe_id: str, recipe: Any, respondents: dict[int, int]) -> float | None:
        """n_eff of ``respondents`` (``arithmetic.effective_respondents``, in the mapping's own
        order: the sum's last bit depends on it), None where it is not a positive number
        (the one-crowd path then says why); kept per distinct mapping."""
        cache_key = (recipe_id, tuple(respondents.items()))
        if cache_key in self._respondents:
            return self._respondents[cache_key]
        try:
            n_eff = arithmetic.effective_respondents(respondents, recipe.instance_weights)
        except ValueError:
            n_eff = None
        if n_eff is not None and not (n_eff > 0 and math.isfinite(n_eff)):
            n_eff = None
        if len(self._respondents) >= _RESPONDENTS_LIMIT:
            self._respondents.clear()
        self._respondents[cache_key] = n_eff
        return n_eff

    def row_groups(
        self, crowds: list[tuple[arithmetic.CrowdKey, arithmetic.Accumulator | None]]
    ) -> tuple[list[RowGroup], list[int]]:
        """Split a bucket's crowds into groups of one recipe whose estimates are made together
        (histogram crowds with dense counts over their recipe's message domain, an n_eff > 0
        and a recipe whose estimator :func:`arithmetic.estimate_histogram_rows` handles) and
        the positions of the others, which go one by one (:meth:`estimate`): longitudinal
        crowds, count-mean sketches, sparse domains, crowds without respondents."""
        groups: dict[str, RowGroup] = {}
        single: list[int] = []
        book = self._config.book
        for position, (key, accumulator) in enumerate(crowds):
            recipe_id = key[4]  # the book's key of the recipe (Recipe.id is made per call)
            recipe = book.get(recipe_id)
            if (
                recipe is None
                or key[0] != arithmetic.HISTOGRAM
                or not isinstance(accumulator, arithmetic.CrowdAccumulator)
            ):
                single.append(position)
                continue
            randomizer = self._row_randomizer(recipe_id, recipe)
            counts = accumulator.counts
            n_eff = None
            if (
                randomizer is not None
                and counts.is_dense
                and counts.domain_size == randomizer.message_domain_size
            ):
                n_eff = self._effective(recipe_id, recipe, accumulator.respondents)
            if n_eff is None:
                single.append(position)
                continue
            _add_to_group(
                groups, recipe_id, recipe, randomizer,
                (position, key, counts.dense(), n_eff, accumulator.respondents,
                 accumulator.messages, accumulator.rejected),
            )  # fmt: skip
        return list(groups.values()), single

    def bucket_crowds(self, content: arithmetic.BucketContent) -> BucketCrowds | None:
        """:meth:`row_groups` of a bucket's content read as columns: the histogram crowds held
        as rows of one matrix per domain size (``arithmetic.CrowdBucket.content``) go to their
        group as rows of that matrix, without an accumulator per crowd; an accumulator is made
        only for the crowds that go one by one or whose messages were all rejected. The same
        groups, positions and notes as :meth:`row_groups` of ``bucket.items()``; None when a
        crowd is in two parts of the content (the caller then takes the items). The crowds are
        ordered, split and gathered over index arrays: per crowd, Python only looks up its
        kind, recipe and n_eff."""
        others = list(content.others)
        parts = _ContentParts(content, others)
        flat = parts.keys
        # crowd_sort_key order: the keys' own unless a crowd ID is null (None before strings)
        if any(key[5] is None for key in flat):
            order = sorted(range(len(flat)), key=lambda i: arithmetic.crowd_sort_key(flat[i]))
        else:
            order = sorted(range(len(flat)), key=flat.__getitem__)
        ordered = [flat[i] for i in order]
        if any(map(operator.eq, ordered, ordered[1:])):
            return None
        # Per crowd (flat order): whether all its messages were rejected (a note, no
        # position), its group (an index of `recipes`; -1: one by one) and n_eff; for an
        # other in a group, the group columns row_groups made of it.
        count = len(flat)
        excluded = np.zeros(count, dtype=bool)
        group_of = np.full(count, -1, dtype=np.int64)
        n_eff = np.zeros(count)
        recipes: dict[str, int] = {}
        made: dict[int, RowGroup] = {}
        for domain, rows, start in parts.rows():
            size = len(rows.keys)
            own = slice(start, start + size)
            excluded[own] = (rows.messages == 0) & np.fromiter(
                map(bool, rows.rejected), dtype=bool, count=size
            )
            kinds, _, _, _, recipe_ids, _ = zip(*rows.keys, strict=True)
            wanted = rows.dense & ~excluded[own]
            wanted &= np.fromiter(map(arithmetic.HISTOGRAM.__eq__, kinds), dtype=bool, count=size)
            index = {recipe_id: code for code, recipe_id in enumerate(dict.fromkeys(recipe_ids))}
            codes = np.fromiter(map(index.__getitem__, recipe_ids), dtype=np.int64, count=size)
            for recipe_id, code in index.items():
                members = np.flatnonzero(wanted & (codes == code))
                recipe = self._config.book.get(recipe_id)
                if not members.size or recipe is None:
                    continue
                randomizer = self._row_randomizer(recipe_id, recipe)
                if randomizer is None or randomizer.message_domain_size != domain:
                    continue
                respondents = rows.respondents
                effective = self._effective_many(
                    recipe_id, recipe, [respondents[row] for row in members.tolist()]
                )
                known = np.array([value is not None for value in effective], dtype=bool)
                group_of[start + members[known]] = recipes.setdefault(recipe_id, len(recipes))
                n_eff[start + members[known]] = [v for v in effective if v is not None]
        for row, key in enumerate(others):  # accumulator objects: what row_groups does
            index_ = parts.others_start + row
            accumulator = content.others[key]
            if arithmetic.all_rejected_note(key, accumulator) is not None:
                excluded[index_] = True
                continue
            groups_, singles = self.row_groups([(key, accumulator)])
            if not singles:
                group_of[index_] = recipes.setdefault(key[4], len(recipes))
                made[index_] = groups_[0]
        order_array = np.array(order, dtype=np.int64)
        kept = order_array[~excluded[order_array]]  # the flat index of each position
        keys = [flat[i] for i in kept.tolist()]
        notes = [
            arithmetic.all_rejected_note(flat[i], parts.accumulator(i))
            for i in order_array[excluded[order_array]].tolist()
        ]
        kept_groups = group_of[kept]
        single = np.flatnonzero(kept_groups < 0).tolist()
        in_group = np.flatnonzero(kept_groups >= 0)  # positions
        # groups in order of their first crowd (as row_groups makes them)
        first = dict.fromkeys(kept_groups[in_group].tolist())
        groups = []
        for code in first:
            positions = in_group[kept_groups[in_group] == code]
            groups.append(parts.group(kept[positions], positions, n_eff, made, self))

        def accumulator(position: int) -> arithmetic.Accumulator:
            return parts.accumulator(int(kept[position]))

        return BucketCrowds(keys, groups, single, notes, accumulator)

    def _effective_many(
        self, recipe_id: str, recipe: Any, respondents: list[dict[int, int]]
    ) -> list[float | None]:
        """:meth:`_effective` of each mapping, looked up once per distinct mapping."""
        seen: dict[tuple, float | None] = {}
        out = []
        for mapping in respondents:
            items = tuple(mapping.items())
            if items in seen:
                out.append(seen[items])
            else:
                out.append(seen.setdefault(items, self._effective(recipe_id, recipe, mapping)))
        return out

    def estimate_rows(self, group: RowGroup) -> RowEstimates:
        """De-bias a :class:`RowGroup` at once (``arithmetic.estimate_histogram_rows``): one
        table for all its rows (``tables.histogram_rows_table``) and its report lines
        (``report_files.HistogramReportLines``), each equal to what :meth:`estimate` and
        ``json_line`` make of the crowd alone. The crowds with a simulation's truth (at most one
        per recipe and window: the crowd without a crowd ID) get their accuracy one by one."""
        config = self._config
        try:
            rows, refused = arithmetic.estimate_sum_rows(
                group.randomizer,
                group.keys,
                group.sums if isinstance(group.sums, np.ndarray) else np.stack(group.sums),
                np.array(group.respondents),
                group.by_instance,
                np.asarray(group.messages, dtype=np.int64),
                config.postprocessing,
            )
        except ValueError:  # a recipe-wide refusal: each crowd's own call states it
            empty: tuple[list[str], list[str], list[str]] = ([], [], [])
            return RowEstimates([], empty, self._schema.empty_table(), [], list(group.positions))
        positions = group.positions
        rejected = group.rejected
        if refused.size:
            refused_set = set(refused.tolist())
            kept = [i for i in range(len(positions)) if i not in refused_set]
            refused_positions = [positions[i] for i in refused.tolist()]
            positions = [positions[i] for i in kept]
            rejected = [rejected[i] for i in kept]
        else:
            refused_positions = []
        accuracy: dict[int, dict[str, float]] = {}
        truth_rows: dict[int, np.ndarray] = {}
        if self._truth:
            for row, key in enumerate(rows.keys):
                truth = self._truth_for(key)
                if truth is None:
                    continue
                result = rows.result(row)
                buckets, counts = truth.window(key[1])
                accuracy[row] = arithmetic.histogram_accuracy(result, buckets, counts)
                keys, values = arithmetic.sparse_truth(buckets, counts)
                truth_rows[row] = arithmetic.values_at(result.buckets, keys, values)
        lines = self._lines.pieces(group.recipe, rows, accuracy, rejected)
        table = histogram_rows_table(rows, config, truth_rows, self._schema)
        pictures = []
        for row, key in enumerate(rows.keys):
            if key in config.pictured:
                result = rows.result(row)
                report = arithmetic.histogram_report(
                    group.recipe, result, config.deletion, accuracy.get(row), rejected[row]
                )
                own = histogram_table(result, config, truth_rows.get(row), self._schema)
                pictures.append((report, own))
        return RowEstimates(positions, lines, table, pictures, refused_positions)

    def _longitudinal(
        self, recipe: Any, key: arithmetic.CrowdKey, accumulator: arithmetic.LongitudinalAccumulator
    ) -> list[tuple[dict[str, Any], pa.Table | None]]:
        config = self._config
        results = arithmetic.estimate_longitudinal(
            recipe, key, accumulator, config.failure_probability
        )
        out = []
        for result in results:
            truth = None
            source = self._truth_for(key)
            if source is not None:
                truth = source.marginals(result.window_starts())
            windows = set(result.window_starts().tolist())
            respondents: dict[int, int] = {}
            for (window, instance), count in accumulator.respondents.items():
                if window in windows:  # per-period crowds: the smallest period bounds ε_c
                    respondents[instance] = min(respondents.get(instance, count), count)
            table = longitudinal_table(result, config, truth)
            report = arithmetic.longitudinal_report(
                recipe, result, respondents, config.deletion, truth
            )
            out.append((report, table))
        return out


class _ContentParts:
    """A bucket's content (``arithmetic.CrowdBucket.content``) as one flat list of its crowds'
    keys: each domain's rows in turn, then the other accumulators; what
    :meth:`CrowdEstimator.bucket_crowds` indexes."""

    def __init__(self, content: arithmetic.BucketContent, others: list) -> None:
        self._content, self._others = content, others
        self._rows = list(content.rows.items())
        sizes = [len(rows.keys) for _, rows in self._rows] + [len(others)]
        self.keys = [key for _, rows in self._rows for key in rows.keys] + others
        self.others_start = sum(sizes[:-1])
        self.part_of = np.repeat(np.arange(len(sizes)), sizes)  # len(self._rows): the others
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.row_of = np.arange(len(self.keys)) - self.starts[self.part_of]

    def rows(self) -> Iterator[tuple[int, Any, int]]:
        """(domain, rows, flat index of the first row) of each nonempty domain."""
        for (domain, rows), start in zip(self._rows, self.starts.tolist(), strict=False):
            if rows.keys:
                yield domain, rows, start

    def accumulator(self, index: int) -> arithmetic.Accumulator:
        """The accumulator of crowd ``index`` (flat)."""
        part, row = int(self.part_of[index]), int(self.row_of[index])
        if part == len(self._rows):
            return self._content.others[self._others[row]]
        return self._rows[part][1].accumulator(row)

    def group(
        self,
        members: np.ndarray,
        positions: np.ndarray,
        n_eff: np.ndarray,
        made: Mapping[int, RowGroup],
        estimator: CrowdEstimator,
    ) -> RowGroup:
        """The :class:`RowGroup` of crowds ``members`` (flat, at ``positions``): taken as index
        arrays from one domain's rows, else crowd by crowd."""
        parts = self.part_of[members]
        part = int(parts[0])
        if part < len(self._rows) and (parts == part).all():
            rows = self._rows[part][1]
            at = self.row_of[members]
            listed = at.tolist()
            recipe_id = rows.keys[listed[0]][4]
            recipe = estimator._config.book.get(recipe_id)
            return RowGroup(
                recipe,
                estimator._row_randomizer(recipe_id, recipe),
                positions.tolist(),
                [rows.keys[row] for row in listed],
                rows.counts[at],
                n_eff[members].tolist(),
                [rows.respondents[row] for row in listed],
                rows.messages[at].tolist(),
                [rows.rejected[row] for row in listed],
            )
        columns: list[list] = [[] for _ in range(7)]
        recipe = randomizer = None
        for index, position in zip(members.tolist(), positions.tolist(), strict=True):
            found = made.get(index)
            if found is not None:
                recipe, randomizer = found.recipe, found.randomizer
                crowd = (position, *(column[0] for column in found[3:]))
            else:
                rows = self._rows[int(self.part_of[index])][1]
                row = int(self.row_of[index])
                recipe_id = rows.keys[row][4]
                recipe = estimator._config.book.get(recipe_id)
                randomizer = estimator._row_randomizer(recipe_id, recipe)
                crowd = (position, rows.keys[row], rows.counts[row], float(n_eff[index]),
                         rows.respondents[row], int(rows.messages[row]), rows.rejected[row])  # fmt: skip
            for column, value in zip(columns, crowd, strict=True):
                column.append(value)
        columns[2] = np.stack(columns[2])
        return RowGroup(recipe, randomizer, *columns)


class _Batches:
    """One bucket's output rows of one kind, concatenated every ``rows_per_batch`` rows."""

    def __init__(self, rows_per_batch: int) -> None:
        self._rows_per_batch = rows_per_batch
        self._tables: list[pa.Table] = []
        self._rows = 0

    def add(self, table: pa.Table) -> pa.Table | None:
        if table.num_rows:
            self._tables.append(table)
            self._rows += table.num_rows
        return self.flush() if self._rows >= self._rows_per_batch else None

    def flush(self) -> pa.Table | None:
        tables, self._tables, self._rows = self._tables, [], 0
        return concat_compact(tables) if tables else None


@beam.typehints.with_output_types(typing.Any)
class EstimateBucket(beam.DoFn):
    """(bucket key, CrowdBucket) -> the bucket's outputs, each as batches for its part
    (``shard_of(bucket key, parts)``): ``(part, compressed Arrow IPC bytes)`` of histogram and
    longitudinal rows (``pack_table``; every :data:`ROWS_PER_BATCH` rows and at the bucket's end), ``(part, compressed JSON
    Lines)`` of reports and of withheld-crowd notes, ``(report, table)`` of the pictured crowds
    and one dict of totals (main output). Nothing leaves per crowd except pictures.

    The histogram crowds of one recipe are de-biased together, as the rows of one matrix
    (:meth:`CrowdEstimator.estimate_rows`, about :data:`ROWS_PER_BATCH` rows at a time; taken
    from the bucket's columns by :meth:`CrowdEstimator.bucket_crowds`), into
    one table and report lines joined from cached texts; the others (longitudinal rounds,
    count-mean sketches, sparse domains, crowds without respondents) one by one
    (:meth:`CrowdEstimator.estimate`). ``crowd_at_a_time`` takes every crowd one by one: the
    reference the rows are tested against (the same lines, and the same table rows up to their
    order within a batch; every part file is sorted when written).

    With ``spill_dir``, a bucket's batches are written together to a file there
    (``analysis_tables.spill_batches``, named by bucket key and index; a new file every
    :data:`~transforms.analyzer.tables.SPILL_FILE_BYTES` of them) and ``(part, SpilledBatch)``
    leaves instead of each batch's bytes: the groupings into parts then hold a file position
    per batch, nothing that grows with the rows."""

    def __init__(
        self,
        config: AnalysisConfig,
        parts: int = 1,
        rows_per_batch: int = ROWS_PER_BATCH,
        spill_dir: str | None = None,
        crowd_at_a_time: bool = False,
    ) -> None:
        self._config = config
        self._parts = max(1, int(parts))
        self._rows_per_batch = int(rows_per_batch)
        self._spill_dir = spill_dir
        self._crowd_at_a_time = bool(crowd_at_a_time)
        self._estimator = CrowdEstimator(config)
        self._given: object = None  # the list of evaluations last given (_remember)

    def setup(self) -> None:
        self._estimator.setup()

    def _remember(self, amplifications: list[bytes]) -> None:
        """The privacy evaluations of the released crowd sizes (:class:`EvaluateCrowdSizes`),
        given to this process's accounting once per list."""
        if amplifications is self._given:
            return
        entries: dict = {}
        for blob in amplifications:
            entries.update(pickle.loads(blob))
        accounting.remember_amplifications(entries)
        self._given = amplifications

    def process(
        self,
        element: tuple[arithmetic.AnalysisBucketKey, arithmetic.CrowdBucket | None],
        amplifications: list[bytes] | None = None,
    ) -> Iterator[Any]:
        unit, bucket = element
        if amplifications is not None:
            self._remember(amplifications)
        if bucket is None:
            return
        part = shard_of(unit, self._parts)
        spill = None if self._spill_dir is None else _BucketSpill(self._spill_dir, unit, part)

        def out(tag: str, data: bytes) -> list[beam.pvalue.TaggedOutput]:
            if spill is None:
                return [beam.pvalue.TaggedOutput(tag, (part, data))]
            return spill.add(tag, data)

        tables = {HISTOGRAM_TAG: _Batches(self._rows_per_batch)}
        tables[LONGITUDINAL_TAG] = _Batches(self._rows_per_batch)
        totals: dict[str, int] = {}
        estimated: set[WindowCrowd] = set()
        pictured = self._config.pictured
        content = bucket.content()
        split = None if self._crowd_at_a_time else self._estimator.bucket_crowds(content)
        if split is None:  # every crowd as an accumulator
            rejected_notes = []
            crowds = []
            for key, accumulator in bucket.items():
                note = arithmetic.all_rejected_note(key, accumulator)
                if note is not None:  # nothing of the crowd could be counted: no estimate
                    rejected_notes.append(note)
                else:
                    crowds.append((key, accumulator))
            keys = [key for key, _ in crowds]
            if self._crowd_at_a_time:
                groups, positions = [], list(range(len(crowds)))
            else:
                groups, positions = self._estimator.row_groups(crowds)
            single = positions

            def accumulator_of(position: int) -> arithmetic.Accumulator:
                return crowds[position][1]
        else:
            keys, groups, single, rejected_notes, accumulator_of = split
        # The report lines, as (head, shared text, tail) (HistogramReportLines.pieces; a whole
        # line its head), their sort keys and their crowds' positions: the rows' in bulk.
        positions: list[int] = []
        heads: list[str] = []
        shared: list[str] = []
        tails: list[str] = []
        orders: list[tuple] = []
        estimated_keys: list[arithmetic.CrowdKey] = []  # by the rows
        for group in groups:
            domain = max(1, group.randomizer.message_domain_size)
            size = max(1, self._rows_per_batch // domain)
            for start in range(0, len(group.positions), size):
                chunk = RowGroup(
                    *group[:2], *(column[start : start + size] for column in group[2:])
                )
                rows = self._estimator.estimate_rows(chunk)
                single.extend(rows.refused)
                if rows.positions:  # every line a histogram report, each with its notes
                    chunk_keys = [keys[position] for position in rows.positions]
                    positions += rows.positions
                    heads += rows.lines[0]
                    shared += rows.lines[1]
                    tails += rows.lines[2]
                    orders += histogram_report_orders(chunk_keys)
                    estimated_keys += chunk_keys
                    totals["histograms"] = totals.get("histograms", 0) + len(rows.positions)
                    totals["with_notes"] = totals.get("with_notes", 0) + len(rows.positions)
                batch = tables[HISTOGRAM_TAG].add(rows.table)
                if batch is not None:
                    yield from out(HISTOGRAM_TAG, pack_table(batch))
                for picture in rows.pictures:
                    yield beam.pvalue.TaggedOutput(PICTURE_TAG, picture)
        for position in sorted(single):
            key, accumulator = keys[position], accumulator_of(position)
            for report, table in self._estimator.estimate(key, accumulator):
                for name, count in report_totals(report).items():
                    totals[name] = totals.get(name, 0) + count
                estimated.update(estimated_crowds(report))
                positions.append(position)
                heads.append(json_line(report))
                shared.append("")
                tails.append("")
                orders.append(report_order(report))
                if table is None:
                    continue
                tag = LONGITUDINAL_TAG if key[0] == arithmetic.LONGITUDINAL else HISTOGRAM_TAG
                batch = tables[tag].add(table)
                if batch is not None:
                    yield from out(tag, pack_table(batch))
                if key in pictured:
                    yield beam.pvalue.TaggedOutput(PICTURE_TAG, (report, table))
        for tag, pending in tables.items():
            batch = pending.flush()
            if batch is not None:
                yield from out(tag, pack_table(batch))
        if positions:  # in the crowds' order (a crowd's several lines in theirs)
            order = np.argsort(np.array(positions, dtype=np.int64), kind="stable").tolist()
            yield from out(
                REPORT_TAG,
                pack_lines(
                    [heads[i] for i in order],
                    [orders[i] for i in order],
                    [shared[i] for i in order],
                    [tails[i] for i in order],
                ),
            )
        withheld = arithmetic.withheld_records(content.withheld)
        if withheld:  # the rows' crowds as withheld_notes reads them (window_start, names)
            estimated.update(map(operator.itemgetter(1, 3, 4, 5), estimated_keys))
        notes = arithmetic.withheld_notes(withheld, estimated)
        notes = sorted(notes + rejected_notes, key=note_order)
        if notes:
            totals["withheld"] = len(notes)
            notes_lines = [json_line(note) for note in notes]
            yield from out(NOTE_TAG, pack_lines(notes_lines, [note_order(note) for note in notes]))
        if spill is not None:
            yield from spill.flush()
        yield totals


class _BucketSpill:
    """One bucket's batches waiting to be spilled together (:class:`EstimateBucket` with a spill
    directory): written to one file once they weigh :data:`SPILL_FILE_BYTES`, and at the
    bucket's end, each file named by the bucket key and its index (the same names on a retry);
    each batch leaves as ``(part, SpilledBatch)`` on its tag."""

    def __init__(self, directory: str, unit: arithmetic.AnalysisBucketKey, part: int) -> None:
        self._directory, self._unit, self._part = directory, unit, part
        self._waiting: list[tuple[str, bytes]] = []  # (tag, batch)
        self._bytes = 0
        self._files = 0

    def add(self, tag: str, data: bytes) -> list[beam.pvalue.TaggedOutput]:
        self._waiting.append((tag, data))
        self._bytes += len(data)
        return self.flush() if self._bytes >= SPILL_FILE_BYTES else []

    def flush(self) -> list[beam.pvalue.TaggedOutput]:
        if not self._waiting:
            return []
        kind, start, end, bucket = self._unit
        name = f"{kind}-{start}-{end}-b{bucket:05d}-{self._files:05d}"
        tags, batches = zip(*self._waiting, strict=True)
        spilled = spill_batches(self._directory, name, batches)
        self._waiting, self._bytes, self._files = [], 0, self._files + 1
        return [
            beam.pvalue.TaggedOutput(tag, (self._part, where))
            for tag, where in zip(tags, spilled, strict=True)
        ]


class EstimateOutputs(NamedTuple):
    totals: beam.PCollection  # one dict of report and note counts per bucket
    reports: beam.PCollection  # (part, compressed JSON Lines of reports)
    notes: beam.PCollection  # (part, compressed JSON Lines of withheld-crowd notes)
    histograms: beam.PCollection  # (part, pack_table bytes)
    longitudinal: beam.PCollection  # (part, pack_table bytes)
    pictures: beam.PCollection  # (report, Arrow table) of the crowds in config.pictured


class EvaluateCrowdSizes(beam.DoFn):
    """(respondents, recipe IDs) -> the ``amplify`` evaluations of the privacy reports of
    crowds of that size of each recipe (``privacy.accounting.recorded_amplifications`` of
    ``arithmetic.privacy_summary``), pickled.

    A report's central guarantee costs milliseconds per distinct crowd size (its root searches:
    about 17 ms for a one-hot recipe's two bounds at a few hundred respondents, more for large
    crowds); in :class:`EstimateBucket` every worker would evaluate every size its buckets hold,
    and crowds of many sizes spread over every bucket, so more workers would not make it
    shorter. Here each size is evaluated once, the sizes spread over the workers, and the
    estimates read the evaluations as a side input. One size's recipes are evaluated together:
    recipes of the same privacy parameters share their evaluations. A recipe the accounting
    refuses at that size gives nothing: the report's own evaluation says why."""

    def __init__(self, config: AnalysisConfig) -> None:
        self._config = config

    def process(self, size: tuple[int, Iterable[str]]) -> Iterator[bytes]:
        respondents, recipe_ids = size
        entries: dict = {}
        for recipe_id in sorted(set(recipe_ids)):
            recipe = self._config.book.get(recipe_id)
            if recipe is None:
                continue
            weights = recipe.instance_weights
            crowd = {instance: int(respondents) for instance in range(len(weights))}
            summary = functools.partial(
                arithmetic.privacy_summary, recipe, crowd, self._config.deletion
            )
            try:
                entries.update(accounting.recorded_amplifications(summary))
            except (ValueError, ArithmeticError):
                continue
        if entries:
            yield pickle.dumps(entries, pickle.HIGHEST_PROTOCOL)


class EstimateBuckets(beam.PTransform):
    """(bucket key, CrowdBucket) -> :class:`EstimateOutputs` (batches for ``parts`` parts,
    spilled to files under ``spill_dir`` when given: :class:`EstimateBucket`). With ``sizes``
    (``(recipe ID, respondents)`` of the released crowds, ``AggregateOutputs.crowd_sizes``),
    each distinct size's privacy is evaluated once first (:class:`EvaluateCrowdSizes`)."""

    def __init__(
        self,
        config: AnalysisConfig,
        parts: int = 1,
        spill_dir: str | None = None,
        sizes: beam.PCollection | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        self._parts = int(parts)
        self._spill_dir = spill_dir
        self._sizes = sizes

    def expand(self, buckets: beam.PCollection) -> EstimateOutputs:
        estimate = EstimateBucket(self._config, self._parts, spill_dir=self._spill_dir)
        side_inputs = []
        if self._sizes is not None:
            evaluated = (
                self._sizes
                | "BySize" >> beam.Map(lambda size: (size[1], size[0]))
                | "GroupSizes" >> beam.GroupByKey()
                | "EvaluateSizes" >> beam.ParDo(EvaluateCrowdSizes(self._config))
            )
            side_inputs.append(beam.pvalue.AsList(evaluated))
        tags = (REPORT_TAG, NOTE_TAG, HISTOGRAM_TAG, LONGITUDINAL_TAG, PICTURE_TAG)
        outputs = buckets | "Estimate" >> beam.ParDo(estimate, *side_inputs).with_outputs(
            *tags, main="totals"
        )
        return EstimateOutputs(outputs.totals, *(outputs[tag] for tag in tags))


def write_summary(
    path: str,
    inputs: Mapping[str, Any],
    totals: Mapping[str, int],
    metrics: Mapping[str, Any],
    parts: int,
) -> dict[str, Any]:
    """summary.json: inputs, metrics and totals; the per-crowd reports and withheld-crowd notes
    are in ``reports.jsonl/`` and ``withheld.jsonl/`` (``transforms.analyzer.report_files``)."""
    summary = {
        "inputs": dict(inputs),
        "metrics": dict(metrics),
        "reports": {
            "path": REPORTS_DIR,
            "parts": parts,
            "histograms": int(totals.get("histograms", 0)),
            "longitudinal": int(totals.get("longitudinal", 0)),
            "with_notes": int(totals.get("with_notes", 0)),
        },
        "withheld": {
            "path": WITHHELD_DIR,
            "parts": parts,
            "crowds": int(totals.get("withheld", 0)),
        },
    }
    summary = json_ready(summary)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        sink.write(json.dumps(summary, indent=2, sort_keys=False, allow_nan=False).encode())
    return summary


class WriteAnalysis(beam.PTransform):
    """Writes histograms.parquet/ and longitudinal.parquet/ (``parts`` part files each,
    ``analysis_tables.WriteTableBatches``), reports.jsonl/ and withheld.jsonl/ (per-crowd reports
    and notes on withheld crowds, ``analysis_reports.WriteLineBatches``), all four through one
    grouping by part (``analysis_tables.WriteParts``), and summary.json into ``output_dir``,
    from :class:`EstimateOutputs` of ``parts`` parts and the counters.

    Every grouping carries batches of a bucket's rows or lines, never one element per crowd;
    summary.json is written once, after every part, from totals only: no worker and not the
    driver holds every crowd's report.
    """

    def __init__(
        self,
        output_dir: str,
        config: AnalysisConfig,
        inputs: Mapping[str, Any],
        parts: int = 1,
    ) -> None:
        super().__init__()
        self._parts = int(parts)
        self._output_dir = output_dir
        self._config = config
        self._inputs = dict(inputs)

    def expand(self, outputs: tuple[EstimateOutputs, beam.PCollection]) -> beam.PCollection:
        estimates, counts = outputs
        output_dir, config, parts = self._output_dir, self._config, self._parts
        join = FileSystems.join
        summary_path = join(output_dir, SUMMARY_FILE)
        pipeline = estimates.totals.pipeline
        written = (
            estimates.histograms,
            estimates.longitudinal,
            estimates.reports,
            estimates.notes,
        ) | "WriteParts" >> WriteParts(
            [
                WriteTableBatches(
                    join(output_dir, HISTOGRAMS_FILE), histogram_schema(config), parts
                ).writer(),
                WriteTableBatches(
                    join(output_dir, LONGITUDINAL_FILE), longitudinal_schema(config), parts
                ).writer(),
                WriteLineBatches(join(output_dir, REPORTS_DIR), parts, report_order).writer(),
                WriteLineBatches(join(output_dir, WITHHELD_DIR), parts, note_order).writer(),
            ],
            parts,
        )
        totals = estimates.totals | "SumTotals" >> beam.CombineGlobally(SumCounts())
        inputs = self._inputs

        def summarize(_: Any, totals: dict, counts: dict, written: list) -> dict[str, Any]:
            return write_summary(summary_path, inputs, totals, metrics_summary(counts), parts)

        trigger = pipeline | "SummaryTrigger" >> beam.Create([None])
        return trigger | "WriteSummary" >> beam.Map(
            summarize,
            totals=beam.pvalue.AsSingleton(totals),
            counts=beam.pvalue.AsSingleton(counts),
            written=beam.pvalue.AsList(written),
        )
