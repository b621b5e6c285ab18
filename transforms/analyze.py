"""The analyzer's second half as Beam transforms: count arrays per crowd in, answers out.

:class:`EstimateCrowds` de-biases each crowd's count arrays with its recipe's estimator at the
effective respondent count n_eff = Σ_u π_u n_u (``transforms.analyze_core``: the respondents
each instance's commit record states it released, weighted by the recipe's instance weights),
adds standard errors, the optional labelled post-processing, the longitudinal marginals of Algorithm 2
(amplification-by-shuffling) with Theorem 6's bound, the privacy report per crowd, and, when a
simulation's truth is given, the accuracy against it. :class:`WriteAnalysis` writes
``histograms.parquet/`` and ``longitudinal.parquet/`` (Parquet datasets written part by part,
``transforms.analysis_tables``), ``reports.jsonl/`` and ``withheld.jsonl/`` (JSON Lines, part by
part, ``transforms.analysis_reports``) and ``summary.json`` (totals only).

Outputs are per crowd (one Arrow table per crowd, one report dict per crowd), never per message.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import analyze_core as core
from transforms.aggregate import metrics_summary
from transforms.analysis_reports import (
    REPORTS_DIR,
    WITHHELD_DIR,
    WithheldNotes,
    WriteJsonParts,
    json_ready,
    note_order,
    report_order,
    report_totals,
    withheld_crowd,
)
from transforms.analysis_tables import (
    WriteTableParts,
    histogram_schema,
    histogram_table,
    longitudinal_schema,
    longitudinal_table,
)
from transforms.combiners import SumCounts

HISTOGRAMS_FILE = "histograms.parquet"
LONGITUDINAL_FILE = "longitudinal.parquet"
SUMMARY_FILE = "summary.json"
HISTOGRAM_TAG = "histogram"
LONGITUDINAL_TAG = "longitudinal"
PICTURE_TAG = "picture"


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


def write_summary(
    path: str,
    inputs: Mapping[str, Any],
    totals: Mapping[str, int],
    metrics: Mapping[str, Any],
    parts: int,
) -> dict[str, Any]:
    """summary.json: inputs, metrics and totals; the per-crowd reports and withheld-crowd notes
    are in ``reports.jsonl/`` and ``withheld.jsonl/`` (``transforms.analysis_reports``)."""
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
    """Writes histograms.parquet/ and longitudinal.parquet/ (``parts`` part files each, see
    :class:`WriteTableParts`), reports.jsonl/ and withheld.jsonl/ (per-crowd reports and notes on
    withheld crowds, ``transforms.analysis_reports``) and summary.json into ``output_dir``.

    ``withheld_crowds``: the commit records' withheld crowds (each with the ``instance`` whose
    commit listed it), joined with the reports per crowd. summary.json is written once, after
    every part, from totals only: no worker and not the driver holds every crowd's report.
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
        output_dir, config, parts = self._output_dir, self._config, self._parts
        join = FileSystems.join
        summary_path = join(output_dir, SUMMARY_FILE)
        pipeline = estimates.reports.pipeline
        withheld = pipeline | "WithheldCrowds" >> beam.Create(self._withheld_crowds)
        withheld_keys = [withheld_crowd(record) for record in self._withheld_crowds]
        notes = (estimates.reports, withheld) | "WithheldNotes" >> WithheldNotes(withheld_keys)
        written = [
            estimates.histograms
            | "WriteHistograms"
            >> WriteTableParts(join(output_dir, HISTOGRAMS_FILE), histogram_schema(config), parts),
            estimates.longitudinal
            | "WriteLongitudinal"
            >> WriteTableParts(
                join(output_dir, LONGITUDINAL_FILE), longitudinal_schema(config), parts
            ),
            estimates.reports
            | "WriteReports" >> WriteJsonParts(join(output_dir, REPORTS_DIR), parts, report_order),
            notes
            | "WriteNotes" >> WriteJsonParts(join(output_dir, WITHHELD_DIR), parts, note_order),
        ]
        totals = (
            (
                estimates.reports | "ReportTotals" >> beam.Map(report_totals),
                notes | "NoteTotals" >> beam.Map(lambda _: {"withheld": 1}),
            )
            | "AllTotals" >> beam.Flatten()
            | "SumTotals" >> beam.CombineGlobally(SumCounts())
        )
        inputs = self._inputs

        def summarize(_: Any, totals: dict, counts: dict, written: list) -> dict[str, Any]:
            return write_summary(summary_path, inputs, totals, metrics_summary(counts), parts)

        trigger = pipeline | "SummaryTrigger" >> beam.Create([None])
        return trigger | "WriteSummary" >> beam.Map(
            summarize,
            totals=beam.pvalue.AsSingleton(totals),
            counts=beam.pvalue.AsSingleton(counts),
            written=beam.pvalue.AsList(tuple(written) | "FilesWritten" >> beam.Flatten()),
        )
