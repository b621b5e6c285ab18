"""The device side of ESA as Beam transforms: population shards in, batches of Report records out.

The pure work lives in ``simulators/``: :class:`simulators.plan.SimulationPlan` is cut into
``ShardSpec`` descriptors; a worker rebuilds recipe, population and fleet once
(:class:`simulators.shards.ShardContext`) and simulates each shard chunk by chunk
(:func:`simulators.shards.simulate_shard`) into one ``simulators.reports.ReportBatch`` per
shuffler instance and chunk. Only descriptors travel through ``beam.Create``; elements are
batches, never single messages; no step holds the population.

* :class:`EncodeReports` yields the ``ReportBatch`` elements (and a ``ShardSummary`` per
  shard on a tagged output) for pipelines that consume reports directly.
* :class:`WriteReportShards` writes them instead, one Avro file per shard and instance
  (``instance=<u>/reports-<shard>.avro``, named by shard index so a retried shard overwrites its
  own files; :func:`write_shard`), and yields the summaries; :class:`CombineShardSummaries` adds
  them up (true counts are summed sparsely, never held per respondent).

Records are encoded by ``simulators.reports.encode_report_records`` and framed by
:class:`schemas.avro.container.ContainerWriter` (Avro 1.11 specification, "Object Container
Files").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas import REPORT, schema_json
from schemas.avro.container import ContainerWriter
from simulators.plan import ShardSpec, ShardSummary, SimulationPlan
from simulators.reports import encode_report_records
from simulators.shards import ShardContext, shard_file_name, simulate_shard

__all__ = [
    "SUMMARY_TAG",
    "write_shard",
    "EncodeReports",
    "WriteReportShards",
    "CombineShardSummaries",
]

SUMMARY_TAG = "summary"


def write_shard(context: ShardContext, shard: ShardSpec, output_dir: str) -> ShardSummary:
    """Simulate one shard and write its Avro file per instance (overwriting a previous attempt)."""
    sync_rng = shard.generator(1)
    schema = schema_json(REPORT)
    sinks: list[Any] = []
    writers = []
    try:
        for instance in range(context.fleet.num_instances):
            path = FileSystems.join(output_dir, shard_file_name(instance, shard.index))
            sink = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
            sinks.append(sink)
            writers.append(
                ContainerWriter(
                    sink,
                    schema,
                    codec=context.plan.codec,
                    sync_marker=sync_rng.bytes(16),
                    compression_level=context.plan.compression_level,
                )
            )
        summary = ShardSummary()
        for item in simulate_shard(context, shard):
            if isinstance(item, ShardSummary):
                summary = item
                continue
            for batch in item[1]:
                writers[batch.shuffler_instance].write(encode_report_records(batch))
    finally:
        for sink in sinks:
            sink.close()
    return summary


# ---------------------------------------------------------------------------------------------
# Beam transforms
# ---------------------------------------------------------------------------------------------


class _ShardFn(beam.DoFn):
    def __init__(self, plan: SimulationPlan) -> None:
        self._plan = plan
        self._context: ShardContext | None = None

    def setup(self) -> None:
        self._context = ShardContext(self._plan)

    def _counters(self, summary: ShardSummary) -> None:
        namespace = "esa.simulate"
        beam.metrics.Metrics.counter(namespace, "respondents").inc(summary.respondents)
        beam.metrics.Metrics.counter(namespace, "refusals").inc(summary.refusals)
        beam.metrics.Metrics.counter(namespace, "messages").inc(int(summary.messages.sum()))
        beam.metrics.Metrics.counter(namespace, "presence_messages").inc(
            int(summary.presence.sum())
        )
        if summary.chaff.size:  # sealed: cover messages beyond the plan (simulators/sealing.py)
            beam.metrics.Metrics.counter(namespace, "chaff_messages").inc(int(summary.chaff.sum()))


class _EncodeShardFn(_ShardFn):
    def process(self, shard: ShardSpec) -> Iterator[Any]:
        assert self._context is not None
        for item in simulate_shard(self._context, shard):
            if isinstance(item, ShardSummary):
                self._counters(item)
                yield beam.pvalue.TaggedOutput(SUMMARY_TAG, item)
            else:
                yield from item[1]


class _WriteShardFn(_ShardFn):
    def __init__(self, plan: SimulationPlan, output_dir: str) -> None:
        super().__init__(plan)
        self._output_dir = output_dir

    def process(self, shard: ShardSpec) -> Iterator[ShardSummary]:
        assert self._context is not None
        summary = write_shard(self._context, shard, self._output_dir)
        self._counters(summary)
        yield summary


class EncodeReports(beam.PTransform):
    """Shard descriptors -> ``ReportBatch`` elements (main output) and one ``ShardSummary`` per
    shard (output tag ``"summary"``)."""

    def __init__(self, plan: SimulationPlan) -> None:
        super().__init__()
        self._plan = plan

    def expand(self, shards: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return (
            shards
            | "Spread shards" >> beam.Reshuffle()  # breaks fusion with Create so shards spread
            | "Encode shards"
            >> beam.ParDo(_EncodeShardFn(self._plan)).with_outputs(SUMMARY_TAG, main="reports")
        )


class WriteReportShards(beam.PTransform):
    """Shard descriptors -> Avro files under ``output_dir`` and one ``ShardSummary`` per shard."""

    def __init__(self, plan: SimulationPlan, output_dir: str) -> None:
        super().__init__()
        self._plan = plan
        self._output_dir = output_dir

    def expand(self, shards: beam.PCollection) -> beam.PCollection:
        return (
            shards
            | "Spread shards" >> beam.Reshuffle()  # breaks fusion with Create so shards spread
            | "Write shards" >> beam.ParDo(_WriteShardFn(self._plan, self._output_dir))
        )


class CombineShardSummaries(beam.CombineFn):
    """Adds ShardSummary elements (sparse true counts merged with ``np.unique``)."""

    def create_accumulator(self) -> ShardSummary:
        return ShardSummary()

    def add_input(self, accumulator: ShardSummary, summary: ShardSummary) -> ShardSummary:
        return accumulator.merge(summary)

    def merge_accumulators(self, accumulators: Any) -> ShardSummary:
        merged = ShardSummary()
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator: ShardSummary) -> ShardSummary:
        return accumulator
