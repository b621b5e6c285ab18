"""Steps 1-3 of the shuffler: read report files, validate records, key and spill valid rows.

Three thin DoFns instead of one that reads, validates, dead-letters, windows, hashes, sorts and
writes: ``ReadReportFile`` (Avro blocks -> column batches; unreadable bytes tagged),
``ValidateBatch`` (``shuffle_core.validate_reports``; rejected records dead-lettered) and
``SpillBatch`` (``shuffle_steps.bucket_rows``: windows, keyed origin hashes, the crowd bucket of
each distinct crowd, sort; then one spill file per batch with the plaintext origin dropped). ``UnreadableToDeadLetter`` accounts for
unreadable bytes in records. ``draw_origin_key`` draws the per-run origin-hash key on a worker
(see ``transforms/shuffler/shuffle.py``).
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms import window as beam_window
from apache_beam.utils.timestamp import Timestamp

from privacy.noise import os_random_source
from schemas import schema_json
from schemas.payloads import EncodedPayloads
from schemas.replays import sealed_rows
from transforms.common import avro_io
from transforms.common.memory import MemoryReleaser
from transforms.shuffler import report_rows, spill
from transforms.shuffler.bundles import CountsBundles
from transforms.shuffler.config import READ, REJECTED_PREFIX, STAGE_READ, UNKNOWN_PREFIX
from transforms.shuffler.replays import piece_replay_keys
from transforms.shuffler.spill import Piece
from transforms.shuffler.steps import bucket_rows, rejected_dead_letters
from transforms.shuffler.steps import count as _count

# ---------------------------------------------------------------------------------------------
# Steps 1-3: read, validate, key and spill
# ---------------------------------------------------------------------------------------------


class ReportRange(typing.NamedTuple):
    """Whole blocks ``start .. stop - 1`` of the report file at ``path``, whose first record is
    the file's record ``first_record`` (``avro_io.block_windows``)."""

    path: str
    start: int
    stop: int
    first_record: int


class PlanReportRanges(beam.DoFn):
    """Path -> the file as :class:`ReportRange` s of at most ``range_records`` records each,
    so that the workers share one large file; the path itself (read whole) when the file has
    one range or cannot be cut: its block headers or schema do not walk (a truncated or damaged
    file, ``schemas.avro.reader.block_windows``), which the whole-file reader then reports.

    A file cut into ranges reads as the whole file does: each range's reader is the whole-file
    reader over its blocks, and both number a record by the declared counts of the blocks before
    it (``path#record=N`` is the same); a block that walks but does not decode is one
    ``corrupt_block`` chunk either way (the reader isolates it); only the batches, which carry
    no meaning, end where a range ends. Bytes that do not walk (a damaged sync marker, a cut
    block) make the whole file one range."""

    def __init__(self, range_records: int) -> None:
        if range_records < 1:
            raise ValueError(f"range_records must be >= 1, got {range_records}")
        self._range_records = int(range_records)

    def process(self, path: str) -> Iterator[str | ReportRange]:
        windows = avro_io.block_windows(path, self._range_records, schema_json("report"))
        if windows is None or len(windows) < 2:
            yield path
            return
        for start, stop, first, _ in windows:
            yield ReportRange(path, start, stop, first)


@beam.typehints.with_output_types(typing.Any)
class ReadReportFile(CountsBundles):
    """Path or :class:`ReportRange` -> ColumnBatch per batch of records; unreadable bytes
    tagged ``unreadable`` (its bundles counted: one file's ranges spread over workers)."""

    def __init__(self, batch_records: int) -> None:
        self._batch_records = batch_records

    def process(self, source: str | ReportRange) -> Iterator[Any]:
        # A file whose writer schema does not resolve to Report is one schema_mismatch chunk.
        expect = schema_json("report")
        path, window = source, None
        if isinstance(source, ReportRange):
            path, window = source.path, (source.start, source.stop, source.first_record)
        self.worked()
        for item in avro_io.read_counted_batches(path, self._batch_records, expect, window):
            if isinstance(item, avro_io.UnreadableChunk):
                yield beam.pvalue.TaggedOutput("unreadable", item)
            else:
                yield item


@beam.typehints.with_output_types(typing.Any)
class UnreadableToDeadLetter(beam.DoFn):
    """UnreadableChunk -> one dead letter, counted in the records it held; a chunk of unknown
    records is counted by reason (``unknown_records:``) and the balance cannot be vouched for."""

    def process(self, chunk: avro_io.UnreadableChunk) -> Iterator[Any]:
        counts: dict[str, int] = {}
        if chunk.records is None:
            _count(counts, UNKNOWN_PREFIX + chunk.reason, 1)
        _count(counts, READ, chunk.records or 0)
        _count(counts, REJECTED_PREFIX + chunk.reason, chunk.records or 0)
        yield beam.pvalue.TaggedOutput("dead_letter", [chunk.dead_letter(STAGE_READ)])
        yield beam.pvalue.TaggedOutput("counts", counts)


@beam.typehints.with_output_types(typing.Any)
class ValidateBatch(beam.DoFn):
    """ColumnBatch -> ColumnBatch of its valid rows; dead letters and counts tagged."""

    def __init__(self, rules: report_rows.ValidationRules) -> None:
        self._rules = rules

    def process(self, item: avro_io.ColumnBatch) -> Iterator[Any]:
        counts: dict[str, int] = {}
        _count(counts, READ, item.rows)
        reasons = report_rows.validate_reports(item.columns, self._rules)
        letters = rejected_dead_letters(item, reasons, self._rules)
        if letters:
            codes, per_code = np.unique(reasons[reasons != report_rows.VALID], return_counts=True)
            for code, number in zip(codes.tolist(), per_code.tolist(), strict=True):
                _count(counts, REJECTED_PREFIX + report_rows.REASONS[code], number)
            yield beam.pvalue.TaggedOutput("dead_letter", letters)
        yield beam.pvalue.TaggedOutput("counts", counts)
        valid = np.flatnonzero(reasons == report_rows.VALID)
        if valid.size:
            # Row i of the kept batch is record first_record + valid[i]: keep that mapping.
            yield item, valid


@beam.typehints.with_output_types(typing.Any)
class SpillBatch(beam.DoFn):
    """(ColumnBatch, valid rows) -> timestamped (BucketKey, Piece), one per crowd bucket in the
    batch (its rows sorted by origin hash, each naming its crowd).

    The origin-hash key arrives as a side input drawn on a worker (see the module docstring)."""

    def __init__(self, window: report_rows.WindowSpec, spill_dir: str, buckets: int) -> None:
        self._window = window
        self._spill_dir = spill_dir
        self._buckets = buckets
        self._release_memory = MemoryReleaser()

    def process(
        self, element: tuple[avro_io.ColumnBatch, np.ndarray], hash_key: np.ndarray
    ) -> Iterator[Any]:
        item, valid = element
        batch = item.columns
        if valid.size < batch.num_rows:
            batch = batch.take(pa.array(valid))
        keyed = bucket_rows(batch, self._window, hash_key, self._buckets)
        # Map positions back to records of the input file.
        record_index = pa.array(
            item.first_record + valid[keyed.rows.column("record_index").to_numpy()]
        )
        rows = keyed.rows.set_column(
            spill.REPORT_SPILL_SCHEMA.get_field_index("record_index"), "record_index", record_index
        )
        min_crowd = rows.column("min_crowd_size").to_numpy()
        # Sealed-shaped payloads before each row: the replay check skips pieces with none.
        sealed = np.r_[
            0, np.cumsum(sealed_rows(EncodedPayloads.from_arrow(rows.column("payload"))))
        ]
        bounds = list(zip(keyed.starts[:-1].tolist(), keyed.starts[1:].tolist(), strict=True))
        path = spill.spill_path(self._spill_dir, "reports")
        positions = spill.write_spill(
            path,
            [rows.slice(b, e - b) for b, e in bounds],
            spill.CHUNK_ROWS,
            # Each piece's replay keys after it: the bucket-wide replay check reads those.
            piece_replay_keys(rows, bounds) if sealed[-1] else None,
        )
        for key, (begin, end), (offset, length, fences) in zip(
            keyed.keys, bounds, positions, strict=True
        ):
            piece = Piece(
                path,
                offset,
                length,
                end - begin,
                item.source,
                int(min_crowd[begin:end].max()),
                int(sealed[end] - sealed[begin]),
                fences,
            )
            # A plain tuple key: Beam has a fast deterministic coder for it.
            yield beam_window.TimestampedValue((tuple(key), piece), Timestamp(micros=key[0] * 1000))
        # The batch is spilled and freed: its pages go back once they add up (memory flat in
        # the input, within MemoryReleaser's margin).
        del item, batch, keyed, rows, element
        self._release_memory()


def draw_origin_key(_: Any) -> np.ndarray:
    """The per-run origin-hash key, drawn on a worker from the OS CSPRNG."""
    return report_rows.new_origin_hash_key(os_random_source())
