"""A report file read in ranges of whole blocks (``PlanReportRanges``, then ``ReadReportFile``
per range) gives the records and dead chunks the whole-file read gives, numbered the same
(``path#record=N``: the place in the file, also after a damaged block); a file whose blocks do
not walk (truncated) or that fits one range is read whole."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pyarrow as pa

from schemas.avro.reader import ColumnBatch, UnreadableChunk
from tests.transforms import report_factory as rf
from transforms.shuffler.read import PlanReportRanges, ReadReportFile, ReportRange

RESPONDENTS, MESSAGES = 120, 3
RANGE_RECORDS = 50


def _file(tmp_path: Path, codec: str = "null") -> str:
    # Small blocks (sync_interval in bytes): the file has many blocks to cut between.
    records = rf.crowd(RESPONDENTS, MESSAGES)
    return rf.write_reports(tmp_path / f"r-{codec}.avro", records, codec, sync_interval=1500)


def _read(source: str | ReportRange, batch_records: int = 64) -> list:
    return [
        item.value if isinstance(item, beam.pvalue.TaggedOutput) else item
        for item in ReadReportFile(batch_records).process(source)
    ]


def _records(items: list) -> tuple[list[int], pa.Table]:
    """Each record's number in its file, and the records as one table."""
    batches = [item for item in items if isinstance(item, ColumnBatch)]
    numbers = [batch.first_record + row for batch in batches for row in range(batch.rows)]
    return numbers, pa.Table.from_batches([batch.columns for batch in batches])


def test_a_file_read_in_ranges_reads_as_the_whole_file(tmp_path: Path) -> None:
    path = _file(tmp_path)
    ranges = list(PlanReportRanges(RANGE_RECORDS).process(path))
    assert len(ranges) >= 4 and all(isinstance(item, ReportRange) for item in ranges)
    assert [r.start for r in ranges[1:]] == [r.stop for r in ranges[:-1]]  # contiguous blocks
    whole_numbers, whole = _records(_read(path))
    ranged = [item for source in ranges for item in _read(source)]
    numbers, table = _records(ranged)
    assert numbers == whole_numbers == list(range(RESPONDENTS * MESSAGES))
    assert table.equals(whole)
    assert not any(isinstance(item, UnreadableChunk) for item in ranged)


def test_a_file_that_does_not_walk_or_fits_one_range_is_read_whole(tmp_path: Path) -> None:
    path = _file(tmp_path)
    whole = Path(path).read_bytes()
    truncated = tmp_path / "truncated.avro"
    truncated.write_bytes(whole[: len(whole) // 2])
    garbage = tmp_path / "garbage.avro"
    garbage.write_bytes(b"no avro here" * 100)
    for bad in (truncated, garbage):
        assert list(PlanReportRanges(RANGE_RECORDS).process(str(bad))) == [str(bad)]
    everything = RESPONDENTS * MESSAGES
    assert list(PlanReportRanges(everything).process(path)) == [path]


def test_a_damaged_block_is_the_same_dead_chunk_read_whole_or_in_ranges(tmp_path: Path) -> None:
    path = _file(tmp_path, "deflate")
    ranges = list(PlanReportRanges(RANGE_RECORDS).process(path))
    data = bytearray(Path(path).read_bytes())
    middle = (ranges[1].start + ranges[1].stop) // 2  # inside the second range's blocks
    data[middle : middle + 20] = bytes(byte ^ 0xFF for byte in data[middle : middle + 20])
    damaged = tmp_path / "damaged.avro"
    damaged.write_bytes(bytes(data))

    whole = _read(str(damaged), batch_records=1000)  # batches of many blocks
    ranged = [
        item
        for source in PlanReportRanges(RANGE_RECORDS).process(str(damaged))
        for item in _read(source, batch_records=1000)
    ]
    chunks = [item for item in whole if isinstance(item, UnreadableChunk)]
    assert len(chunks) == 1 and chunks[0].reason == "corrupt_block" and chunks[0].records
    assert [item for item in ranged if isinstance(item, UnreadableChunk)] == chunks
    numbers = _records(whole)[0]
    assert _records(ranged)[0] == numbers  # the same records, numbered the same
    # Numbered by place in the file: the dead block's records are one gap, none renumbered.
    missing = sorted(set(range(RESPONDENTS * MESSAGES)) - set(numbers))
    assert missing == list(range(missing[0], missing[0] + chunks[0].records))
    assert numbers[-1] == RESPONDENTS * MESSAGES - 1
