"""The analyzer's second half as Beam transforms: count arrays per crowd in, answers out.

:class:`EstimateCrowds` de-biases each crowd's count arrays with its recipe's estimator at the
effective respondent count n_eff = Σ_u π_u n_u (``transforms.analyze_core``: the respondents
each instance's commit record states it released, weighted by the recipe's instance weights), adds standard errors, the
optional labelled post-processing, the longitudinal marginals of Algorithm 2
(amplification-by-shuffling) with Theorem 6's bound, the privacy report per crowd, and, when a
simulation's truth is given, the accuracy against it. :class:`WriteAnalysis` writes
``histograms.parquet/`` and ``longitudinal.parquet/`` (Parquet datasets: one part file per shard
of crowds, so no worker or driver ever holds every crowd's table; ``pyarrow.parquet.read_table``
reads the directory as one table) and ``summary.json``.

Outputs are per crowd (one Arrow table per crowd, one report dict per crowd), never per message.
"""

from __future__ import annotations

import json
import math
import typing
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import analyze_core as core
from transforms.aggregate import metrics_summary

HISTOGRAMS_FILE = "histograms.parquet"
LONGITUDINAL_FILE = "longitudinal.parquet"
SUMMARY_FILE = "summary.json"
HISTOGRAM_TAG = "histogram"
LONGITUDINAL_TAG = "longitudinal"
PICTURE_TAG = "picture"
# Crowd tables are split over part files of about this many rows each.
ROWS_PER_PART = 1_000_000
_TIME = pa.timestamp("ms", tz="UTC")


@dataclass(frozen=True)
class TruthSource:
    """Where a simulation's truth is (``truth.parquet``) and which recipe it describes."""

    path: str
    recipe_id: str

    def __post_init__(self) -> None:
        if not self.path or not self.recipe_id:
            raise ValueError("TruthSource needs a path and a recipe_id")


def read_truth(source: TruthSource) -> core.Truth:
    """``truth.parquet`` of ``esa simulate`` (window_start, bucket, count) as a Truth."""
    with FileSystems.open(source.path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        table = pq.read_table(handle, columns=["window_start", "bucket", "count"])
    window_start = table.column("window_start")
    if pa.types.is_timestamp(window_start.type):
        window_start = window_start.cast(pa.timestamp("ms")).cast(pa.int64())
    return core.Truth(
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

    book: core.RecipeBook
    postprocessing: str = "none"
    failure_probability: float = 0.05
    deletion: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    truth: tuple[TruthSource, ...] = ()
    pictured: frozenset = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.book, core.RecipeBook) or len(self.book) == 0:
            raise ValueError("book must be a non-empty RecipeBook")
        if self.postprocessing not in core.POSTPROCESSING:
            raise ValueError(
                f"postprocessing must be one of {core.POSTPROCESSING}, got {self.postprocessing!r}"
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


def histogram_schema(config: AnalysisConfig) -> pa.Schema:
    """Columns of histograms.parquet (``truth`` only when the simulation's truth is known)."""
    fields = [
        pa.field("window_start", _TIME),
        pa.field("window_end", _TIME),
        pa.field("channel", pa.string()),
        pa.field("recipe_id", pa.string()),
        pa.field("crowd", pa.string()),
        pa.field("bucket", pa.int64()),
        pa.field("estimate", pa.float64()),
        pa.field("stderr", pa.float64()),
        pa.field("raw_count", pa.int64()),
        pa.field("n", pa.float64()),
    ]
    if config.postprocessed_column:
        fields.append(pa.field(config.postprocessed_column, pa.float64()))
    if config.truth:
        fields.append(pa.field("truth", pa.float64()))
    return pa.schema(fields)


def longitudinal_schema(config: AnalysisConfig) -> pa.Schema:
    """Columns of longitudinal.parquet."""
    fields = [
        pa.field("channel", pa.string()),
        pa.field("recipe_id", pa.string()),
        pa.field("crowd", pa.string()),
        pa.field("round_start", _TIME),
        pa.field("period", pa.int32()),
        pa.field("window_start", _TIME),
        pa.field("window_end", _TIME),
        pa.field("estimate", pa.float64()),
        pa.field("stderr", pa.float64()),
        pa.field("error_bound", pa.float64()),
        pa.field("n", pa.float64()),
        pa.field("n_period", pa.float64()),
    ]
    if config.truth:
        fields.append(pa.field("truth", pa.float64()))
    return pa.schema(fields)


def histogram_table(
    result: core.HistogramResult, config: AnalysisConfig, truth: np.ndarray | None
) -> pa.Table:
    """histograms.parquet rows of one crowd."""
    rows = result.buckets.size
    _, start, end, channel, recipe_id, crowd_id = result.key
    columns: dict[str, Any] = {
        "window_start": pa.array(np.full(rows, start, dtype=np.int64)).cast(_TIME),
        "window_end": pa.array(np.full(rows, end, dtype=np.int64)).cast(_TIME),
        "channel": pa.array([channel] * rows, pa.string()),
        "recipe_id": pa.array([recipe_id] * rows, pa.string()),
        "crowd": pa.array([crowd_id] * rows, pa.string()),
        "bucket": pa.array(result.buckets, pa.int64()),
        "estimate": pa.array(result.estimate, pa.float64()),
        "stderr": pa.array(result.stderr, pa.float64()),
        "raw_count": pa.array(result.raw_count, pa.int64())
        if result.raw_count is not None
        else pa.nulls(rows, pa.int64()),
        "n": pa.array(np.full(rows, result.respondents), pa.float64()),
    }
    if config.postprocessed_column:
        columns[config.postprocessed_column] = (
            pa.array(result.postprocessed, pa.float64())
            if result.postprocessed is not None
            else pa.nulls(rows, pa.float64())
        )
    if config.truth:
        columns["truth"] = (
            pa.array(truth, pa.float64()) if truth is not None else pa.nulls(rows, pa.float64())
        )
    return pa.table(columns, schema=histogram_schema(config))


def longitudinal_table(
    result: core.LongitudinalResult, config: AnalysisConfig, truth: np.ndarray | None
) -> pa.Table:
    """longitudinal.parquet rows of one round: one per period t = 1..d."""
    rows = result.periods
    _, _, _, channel, recipe_id, crowd_id = result.key
    starts = result.window_starts()
    columns: dict[str, Any] = {
        "channel": pa.array([channel] * rows, pa.string()),
        "recipe_id": pa.array([recipe_id] * rows, pa.string()),
        "crowd": pa.array([crowd_id] * rows, pa.string()),
        "round_start": pa.array(np.full(rows, result.round_start, dtype=np.int64)).cast(_TIME),
        "period": pa.array(np.arange(1, rows + 1, dtype=np.int32)),
        "window_start": pa.array(starts).cast(_TIME),
        "window_end": pa.array(starts + result.window_ms).cast(_TIME),
        "estimate": pa.array(result.estimate, pa.float64()),
        "stderr": pa.array(result.stderr, pa.float64()),
        "error_bound": pa.array(np.full(rows, result.bound), pa.float64()),
        "n": pa.array(np.full(rows, result.respondents), pa.float64()),
        "n_period": pa.array(result.respondents_per_period, pa.float64()),
    }
    if config.truth:
        columns["truth"] = (
            pa.array(truth, pa.float64()) if truth is not None else pa.nulls(rows, pa.float64())
        )
    return pa.table(columns, schema=longitudinal_schema(config))


@beam.typehints.with_output_types(typing.Any)
class EstimateCrowd(beam.DoFn):
    """(crowd key, accumulator) -> report dict; tagged Arrow tables for the two Parquet files."""

    def __init__(self, config: AnalysisConfig) -> None:
        self._config = config
        self._truth: dict[str, core.Truth] = {}

    def setup(self) -> None:
        self._truth = {source.recipe_id: read_truth(source) for source in self._config.truth}

    def _truth_for(self, key: core.CrowdKey) -> core.Truth | None:
        truth = self._truth.get(key[4])
        return truth if truth is not None and truth.applies_to(key) else None

    def process(self, element: tuple[core.CrowdKey, core.Accumulator]) -> Iterator[Any]:
        key, accumulator = element
        recipe = self._config.book.get(key[4])
        if recipe is None or accumulator is None:  # aggregate_batch only keys known recipes
            return
        if isinstance(accumulator, core.LongitudinalAccumulator):
            yield from self._longitudinal(recipe, key, accumulator)
        else:
            yield from self._histogram(recipe, key, accumulator)

    def _histogram(
        self, recipe: Any, key: core.CrowdKey, accumulator: core.CrowdAccumulator
    ) -> Iterator[Any]:
        config = self._config
        try:
            result = core.estimate_histogram(recipe, key, accumulator, config.postprocessing)
        except ValueError as error:
            report = core.key_fields(key)
            report.update(
                respondents_by_instance={str(u): c for u, c in accumulator.respondents.items()},
                messages=accumulator.messages,
                notes=[f"no estimate: {error}"],
            )
            yield report
            return
        truth_dense = accuracy = None
        truth = self._truth_for(key)
        if truth is not None:
            buckets, counts = truth.window(key[1])
            accuracy = core.histogram_accuracy(result, buckets, counts)
            keys, values = core.sparse_truth(buckets, counts)
            truth_dense = core.values_at(result.buckets, keys, values)
        table = histogram_table(result, config, truth_dense)
        report = core.histogram_report(
            recipe, result, config.deletion, accuracy, accumulator.rejected
        )
        yield beam.pvalue.TaggedOutput(HISTOGRAM_TAG, (key, table))
        if key in config.pictured:
            yield beam.pvalue.TaggedOutput(PICTURE_TAG, (report, table))
        yield report

    def _longitudinal(
        self, recipe: Any, key: core.CrowdKey, accumulator: core.LongitudinalAccumulator
    ) -> Iterator[Any]:
        config = self._config
        results = core.estimate_longitudinal(recipe, key, accumulator, config.failure_probability)
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
            report = core.longitudinal_report(recipe, result, respondents, config.deletion, truth)
            yield beam.pvalue.TaggedOutput(LONGITUDINAL_TAG, (key, table))
            if key in config.pictured:
                yield beam.pvalue.TaggedOutput(PICTURE_TAG, (report, table))
            yield report


class EstimateOutputs(NamedTuple):
    reports: beam.PCollection  # one dict per crowd (per round for longitudinal)
    histograms: beam.PCollection  # (crowd key, Arrow table)
    longitudinal: beam.PCollection  # (crowd key, Arrow table)
    pictures: beam.PCollection  # (report, Arrow table) of the crowds in config.pictured


class EstimateCrowds(beam.PTransform):
    """(crowd key, accumulator) -> :class:`EstimateOutputs`."""

    def __init__(self, config: AnalysisConfig) -> None:
        super().__init__()
        self._config = config

    def expand(self, crowds: beam.PCollection) -> EstimateOutputs:
        outputs = crowds | "Estimate" >> beam.ParDo(EstimateCrowd(self._config)).with_outputs(
            HISTOGRAM_TAG, LONGITUDINAL_TAG, PICTURE_TAG, main="reports"
        )
        return EstimateOutputs(
            outputs.reports,
            outputs[HISTOGRAM_TAG],
            outputs[LONGITUDINAL_TAG],
            outputs[PICTURE_TAG],
        )


def _sort_key(report: Mapping[str, Any]) -> tuple:
    return (
        report.get("kind", ""),
        report.get("channel", ""),
        report.get("recipe_id", ""),
        report.get("crowd_id") or "",
        report.get("window_start", report.get("round_start", 0)),
    )


_SORT_COLUMNS = ("channel", "recipe_id", "crowd", "window_start", "round_start", "bucket", "period")


def shard_of(key: core.CrowdKey, shards: int) -> int:
    """The part file of a crowd: a stable hash of its key (the same on every worker and run)."""
    return zlib.crc32(repr(tuple(key)).encode()) % max(1, int(shards))


def part_path(directory: str, shard: int, shards: int) -> str:
    return FileSystems.join(directory, f"part-{shard:05d}-of-{shards:05d}.parquet")


def write_part(
    directory: str, shard: int, shards: int, tables: Iterable[pa.Table], schema: pa.Schema
) -> str:
    """One part file: the shard's crowd tables, sorted (an empty table with the schema if none).
    Named by shard index, so a retried bundle overwrites its own file."""
    tables = [table for table in tables if table.num_rows]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if table.num_rows:
        table = table.sort_by([(n, "ascending") for n in _SORT_COLUMNS if n in table.column_names])
    path = part_path(directory, shard, shards)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        pq.write_table(table, sink)
    return path


class WriteTableParts(beam.PTransform):
    """(crowd key, Arrow table) -> ``directory/part-SSSSS-of-NNNNN.parquet``: crowds are grouped
    into ``shards`` parts by :func:`shard_of`; each part is written by one worker holding only
    its own crowds; every part exists (empty ones too), so the directory always reads as one
    table with ``schema``."""

    def __init__(self, directory: str, schema: pa.Schema, shards: int) -> None:
        super().__init__()
        if int(shards) < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self._directory, self._schema, self._shards = directory, schema, int(shards)

    def expand(self, tables: beam.PCollection) -> beam.PCollection:
        directory, schema, shards = self._directory, self._schema, self._shards
        keyed = tables | "ByPart" >> beam.Map(lambda kv: (shard_of(kv[0], shards), kv[1]))
        every = tables.pipeline | "PartIndices" >> beam.Create([(s, None) for s in range(shards)])
        return (
            {"tables": keyed, "part": every}
            | "GroupParts" >> beam.CoGroupByKey()
            | "WriteParts"
            >> beam.MapTuple(
                lambda shard, grouped: write_part(
                    directory, shard, shards, grouped["tables"], schema
                )
            )
        )


def table_parts(rows: int, rows_per_part: int = ROWS_PER_PART) -> int:
    """Part files for about ``rows`` rows (at least one)."""
    return max(1, math.ceil(max(0, int(rows)) / max(1, int(rows_per_part))))


def _json_ready(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating | float):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.ndarray):
        return _json_ready(value.tolist())
    return value


def write_summary(
    path: str,
    inputs: Mapping[str, Any],
    reports: Iterable[Mapping[str, Any]],
    metrics: Mapping[str, Any],
    withheld: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """summary.json: inputs, metrics, one entry per crowd and the withheld crowds' notes."""
    reports = sorted(reports, key=_sort_key)
    summary = {
        "inputs": dict(inputs),
        "metrics": dict(metrics),
        "histograms": [r for r in reports if r.get("kind") == core.HISTOGRAM],
        "longitudinal": [r for r in reports if r.get("kind") == core.LONGITUDINAL],
        "withheld": list(withheld),
    }
    summary = _json_ready(summary)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
        sink.write(json.dumps(summary, indent=2, sort_keys=False, allow_nan=False).encode())
    return summary


class WriteAnalysis(beam.PTransform):
    """Writes histograms.parquet/ and longitudinal.parquet/ (``parts`` part files each, see
    :class:`WriteTableParts`) and summary.json into ``output_dir``.

    ``withheld`` is computed from the reports and the commit records' withheld crowds (passed in,
    each with the ``instance`` whose commit listed it). summary.json is written once, by one
    worker, after all crowds are estimated (it gathers the per-crowd report dicts, not tables).
    """

    def __init__(
        self,
        output_dir: str,
        config: AnalysisConfig,
        inputs: Mapping[str, Any],
        withheld_crowds: list[dict[str, Any]],
        parts: int = 1,
    ) -> None:
        super().__init__()
        self._parts = int(parts)
        self._output_dir = output_dir
        self._config = config
        self._inputs = dict(inputs)
        self._withheld_crowds = list(withheld_crowds)

    def expand(self, outputs: tuple[EstimateOutputs, beam.PCollection]) -> beam.PCollection:
        estimates, counts = outputs
        output_dir, config = self._output_dir, self._config
        histogram_path = FileSystems.join(output_dir, HISTOGRAMS_FILE)
        longitudinal_path = FileSystems.join(output_dir, LONGITUDINAL_FILE)
        summary_path = FileSystems.join(output_dir, SUMMARY_FILE)
        histogram_columns = histogram_schema(config)
        longitudinal_columns = longitudinal_schema(config)
        written = [
            estimates.histograms
            | "WriteHistograms" >> WriteTableParts(histogram_path, histogram_columns, self._parts),
            estimates.longitudinal
            | "WriteLongitudinal"
            >> WriteTableParts(longitudinal_path, longitudinal_columns, self._parts),
        ]
        reports = estimates.reports | "AllReports" >> beam.combiners.ToList()
        inputs, withheld_crowds = self._inputs, self._withheld_crowds

        def summarize(_: Any, reports: list, counts: dict, written: list) -> dict[str, Any]:
            estimated = set()
            for report in reports:
                if report.get("kind") == core.HISTOGRAM and "privacy" in report:
                    estimated.add(
                        (report["window_start"], report["channel"], report["recipe_id"],
                         report["crowd_id"])
                    )  # fmt: skip
                elif report.get("kind") == core.LONGITUDINAL:
                    for period in range(report["periods"]):
                        if report["respondents_per_period"][period] > 0:
                            estimated.add(
                                (report["round_start"] + period * report["window_ms"],
                                 report["channel"], report["recipe_id"], report["crowd_id"])
                            )  # fmt: skip
            withheld = core.withheld_notes(withheld_crowds, estimated)
            return write_summary(summary_path, inputs, reports, metrics_summary(counts), withheld)

        files = written[0].pipeline | "SummaryTrigger" >> beam.Create([None])
        return files | "WriteSummary" >> beam.Map(
            summarize,
            reports=beam.pvalue.AsSingleton(reports),
            counts=beam.pvalue.AsSingleton(counts),
            written=beam.pvalue.AsList((written[0], written[1]) | "FilesWritten" >> beam.Flatten()),
        )
