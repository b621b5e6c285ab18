"""The two phases of a Prio3 aggregator as Beam transforms (pure parts: ``shares``).

Phase 1, :class:`OpenShares`: committed message files in; this aggregator's verifier share per
report (for the other aggregator), its verification state per report (private), each crowd's
report count and report-id checksum, and dead letters. Read in column batches, one Beam element
per batch; duplicates of a report id are settled per report (``shares.deduplicate``).

Phase 2, :class:`FinishShares`: this aggregator's states and both aggregators' verifier shares,
joined per report; each report's proof decided (``shares.finish_report``) and the output shares
summed per window and crowd (:class:`SumOutputShares`, a CombineFn over batches of shares);
rejected reports go to the dead letters with their reason.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from schemas.dead_letters import dead_letter
from transforms.aggregators.shares import (
    AggregateShareAccumulator,
    AggregatorSpec,
    CrowdKey,
    OpenedReport,
    ShareOpener,
    deduplicate,
    finish_report,
)
from transforms.common import avro_io

METRICS_NAMESPACE = "esa.aggregate"
DEAD_LETTER_TAG = "dead_letter"
STATE_TAG = "state"
SUMMARY_TAG = "summary"

# Avro schemas of the files the phases exchange (plain longs: no logical types to convert).
VERIFIER_SHARE_SCHEMA = {
    "type": "record",
    "name": "Prio3VerifierShare",
    "namespace": "esa",
    "fields": [
        {"name": "window_start", "type": "long"},
        {"name": "window_end", "type": "long"},
        {"name": "crowd_id", "type": ["null", "string"]},
        {"name": "report_id", "type": "bytes"},
        {"name": "verifier_share", "type": "bytes"},
    ],
}
STATE_SCHEMA = {
    "type": "record",
    "name": "Prio3VerifyState",
    "namespace": "esa",
    "fields": [
        {"name": "window_start", "type": "long"},
        {"name": "window_end", "type": "long"},
        {"name": "crowd_id", "type": ["null", "string"]},
        {"name": "report_id", "type": "bytes"},
        {"name": "state", "type": "bytes"},
    ],
}


def _count(name: str, value: int = 1) -> None:
    if value:
        Metrics.counter(METRICS_NAMESPACE, name).inc(int(value))


def _report_key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record["window_start"], record["window_end"], record["crowd_id"], record["report_id"])


@beam.typehints.with_output_types(typing.Any)
class OpenReleaseFile(beam.DoFn):
    """``path`` of a committed message file -> ``(report key, OpenedReport)`` per usable report;
    dead letters (tagged) for every other record."""

    def __init__(self, spec: AggregatorSpec, batch_records: int) -> None:
        self._spec = spec
        self._batch_records = batch_records
        self._opener: ShareOpener | None = None

    def setup(self) -> None:
        self._opener = ShareOpener(self._spec)  # reads the key ring and verify key from paths

    def process(self, path: str) -> Iterator[Any]:
        assert self._opener is not None
        for item in avro_io.read_avro_batches(path, self._batch_records):
            if isinstance(item, avro_io.UnreadableChunk):
                _count("read", item.records or 0)
                _count(f"rejected_{item.reason}", item.records or 0)
                yield beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, item.dead_letter("aggregate.read"))
                continue
            _count("read", item.rows)
            opened = self._opener.open_batch(item.columns)
            if opened.rejected_rows:
                records = item.columns.take(opened.rejected_rows).to_pylist()
                for row, reason, record in zip(
                    opened.rejected_rows, opened.rejected_reasons, records, strict=True
                ):
                    _count(f"rejected_{reason}")
                    yield beam.pvalue.TaggedOutput(
                        DEAD_LETTER_TAG,
                        dead_letter(
                            "aggregate.open",
                            reason,
                            f"aggregator {self._spec.agg_id} cannot use this report: {reason}",
                            f"{item.source}#record={item.first_record + row}",
                            original_record=record,
                        ),
                    )
            for report in opened.reports:
                # Plain tuples cross the shuffle (deterministic coders, no pickled classes).
                yield (
                    (*report.key, report.report_id),
                    (tuple(report.key), report.report_id, report.verifier_share, report.state),
                )


class SettleDuplicates(beam.DoFn):
    """All copies of one report id -> the report counted, dead letters for the others."""

    def process(self, element: tuple[Any, Iterable[tuple[Any, ...]]]) -> Iterator[Any]:
        key, copies = element
        copies = [OpenedReport(CrowdKey(*c[0]), c[1], c[2], c[3]) for c in copies]
        kept, reasons = deduplicate(copies)
        for reason in reasons:
            _count(f"rejected_{reason}")
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER_TAG,
                dead_letter(
                    "aggregate.open",
                    reason,
                    f"{len(copies)} reports with report id {key[3].hex()}",
                    f"window={key[0]} crowd={key[2]}",
                ),
            )
        if kept is None:
            return
        _count("initialized")
        record = {
            "window_start": kept.key.window_start,
            "window_end": kept.key.window_end,
            "crowd_id": kept.key.crowd_id,
            "report_id": kept.report_id,
        }
        yield record | {"verifier_share": kept.verifier_share}
        yield beam.pvalue.TaggedOutput(STATE_TAG, record | {"state": kept.state})
        yield beam.pvalue.TaggedOutput(SUMMARY_TAG, (tuple(kept.key), kept.report_id))


class CountAndChecksum(beam.CombineFn):
    """Report ids of one crowd -> (count, Σ SHA-256 mod 2^256): what both aggregators compare."""

    def create_accumulator(self) -> tuple[int, int]:
        return 0, 0

    def add_input(self, accumulator: tuple[int, int], report_id: bytes) -> tuple[int, int]:
        from schemas.crypto.prio3_reports import add_checksums, report_id_checksum

        count, checksum = accumulator
        return count + 1, add_checksums(checksum, report_id_checksum([report_id]))

    def merge_accumulators(self, accumulators: Iterable[tuple[int, int]]) -> tuple[int, int]:
        from schemas.crypto.prio3_reports import add_checksums

        count, checksum = 0, 0
        for other_count, other_checksum in accumulators:
            count, checksum = count + other_count, add_checksums(checksum, other_checksum)
        return count, checksum

    def extract_output(self, accumulator: tuple[int, int]) -> tuple[int, int]:
        return accumulator


class PhaseOneOutputs(NamedTuple):
    verifier_shares: beam.PCollection
    states: beam.PCollection
    summaries: beam.PCollection  # (CrowdKey, (count, checksum))
    dead_letters: beam.PCollection


class OpenShares(beam.PTransform):
    """Phase 1: paths of committed message files -> :class:`PhaseOneOutputs`."""

    def __init__(self, spec: AggregatorSpec, batch_records: int = 4096) -> None:
        super().__init__()
        self._spec = spec
        self._batch_records = batch_records

    def expand(self, paths: beam.PCollection) -> PhaseOneOutputs:
        opened = paths | "Open" >> beam.ParDo(
            OpenReleaseFile(self._spec, self._batch_records)
        ).with_outputs(DEAD_LETTER_TAG, main="reports")
        settled = (
            opened.reports
            | "GroupReportId" >> beam.GroupByKey()
            | "Settle"
            >> beam.ParDo(SettleDuplicates()).with_outputs(
                DEAD_LETTER_TAG, STATE_TAG, SUMMARY_TAG, main="verifier_shares"
            )
        )
        summaries = settled[SUMMARY_TAG] | "CountPerCrowd" >> beam.CombinePerKey(CountAndChecksum())
        dead = (opened[DEAD_LETTER_TAG], settled[DEAD_LETTER_TAG]) | "Dead" >> beam.Flatten()
        return PhaseOneOutputs(settled.verifier_shares, settled[STATE_TAG], summaries, dead)


class FinishReport(beam.DoFn):
    """``(report key, {state: [...], shares0: [...], shares1: [...]})`` -> ``(CrowdKey,
    (report id, output share))``, or a dead letter."""

    def __init__(self, spec: AggregatorSpec) -> None:
        self._spec = spec
        self._vdaf = None

    def setup(self) -> None:
        self._vdaf = self._spec.recipe().build_vdaf()

    def process(self, element: tuple[Any, dict[str, list[dict[str, Any]]]]) -> Iterator[Any]:
        key, joined = element
        states = joined["state"]
        shares = [joined["shares0"], joined["shares1"]]
        crowd = CrowdKey(key[0], key[1], key[2])
        if len(states) != 1:  # the other aggregator's report that this one never initialized
            reason, detail = "peer_only_report", "only the other aggregator initialized it"
            output = None
        else:
            output, reason, detail = finish_report(
                self._vdaf,
                self._spec.agg_id,
                states[0]["state"],
                [found[0]["verifier_share"] if len(found) == 1 else None for found in shares],
            )
        if output is None:
            _count(f"rejected_{reason}")
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER_TAG,
                dead_letter(
                    "aggregate.finish",
                    reason,
                    detail,
                    f"window={crowd.window_start} crowd={crowd.crowd_id} report={key[3].hex()}",
                ),
            )
            return
        _count("verified")
        yield tuple(crowd), (key[3], output)


class SumOutputShares(beam.CombineFn):
    """Output shares of one crowd -> (aggregate share, reports, checksum), summed in batches."""

    def __init__(self, spec: AggregatorSpec) -> None:
        self._spec = spec
        self._vdaf = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_spec": self._spec, "_vdaf": None}  # the extension's objects stay on a worker

    def _vdaf_(self):
        if self._vdaf is None:
            self._vdaf = self._spec.recipe().build_vdaf()
        return self._vdaf

    def create_accumulator(self) -> AggregateShareAccumulator:
        return AggregateShareAccumulator()

    def add_input(
        self, accumulator: AggregateShareAccumulator, element: tuple[bytes, bytes]
    ) -> AggregateShareAccumulator:
        accumulator.add(self._vdaf_(), *element)
        return accumulator

    def merge_accumulators(
        self, accumulators: Iterable[AggregateShareAccumulator]
    ) -> AggregateShareAccumulator:
        accumulators = iter(accumulators)
        first = next(accumulators)
        first.merge(self._vdaf_(), accumulators)
        return first

    def compact(self, accumulator: AggregateShareAccumulator) -> AggregateShareAccumulator:
        accumulator.flush(self._vdaf_())
        return accumulator

    def extract_output(self, accumulator: AggregateShareAccumulator) -> tuple[bytes, int, int]:
        return accumulator.share(self._vdaf_()), accumulator.reports, accumulator.checksum


class PhaseTwoOutputs(NamedTuple):
    aggregates: beam.PCollection  # (CrowdKey, (aggregate share, reports, checksum))
    dead_letters: beam.PCollection


class FinishShares(beam.PTransform):
    """Phase 2: {state, shares0, shares1} PCollections of records -> :class:`PhaseTwoOutputs`."""

    def __init__(self, spec: AggregatorSpec) -> None:
        super().__init__()
        self._spec = spec

    def expand(self, inputs: dict[str, beam.PCollection]) -> PhaseTwoOutputs:
        keyed = {
            name: collection | f"Key{name}" >> beam.Map(lambda r: (_report_key(r), r))
            for name, collection in inputs.items()
        }
        finished = (
            keyed
            | "Join" >> beam.CoGroupByKey()
            | "Finish"
            >> beam.ParDo(FinishReport(self._spec)).with_outputs(DEAD_LETTER_TAG, main="outputs")
        )
        aggregates = finished.outputs | "SumPerCrowd" >> beam.CombinePerKey(
            SumOutputShares(self._spec)
        )
        return PhaseTwoOutputs(aggregates, finished[DEAD_LETTER_TAG])
