"""The reader against a generated corpus of hostile files (tests/schemas/avro/hostile/corpus.py):
no exception escapes, and every record is accounted for, read or dead-lettered, or some chunk
says that its records are unknown."""

from __future__ import annotations

import tracemalloc
import warnings

import pytest

from schemas.avro import reader
from schemas.avro.reader import ColumnBatch, UnreadableChunk, read_container_bytes
from tests.schemas.avro.hostile import corpus

with warnings.catch_warnings():  # the reference library warns about logical types it lacks
    warnings.simplefilter("ignore")
    CASES = corpus.all_cases()


def _read(case: corpus.Case) -> tuple[int, list[UnreadableChunk]]:
    items = list(read_container_bytes(case.data, case.name, batch_records=64, expect=case.expect))
    assert all(isinstance(item, ColumnBatch | UnreadableChunk) for item in items)
    read = sum(item.rows for item in items if isinstance(item, ColumnBatch))
    return read, [item for item in items if isinstance(item, UnreadableChunk)]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_record_is_read_or_dead_lettered(case: corpus.Case) -> None:
    read, chunks = _read(case)
    unknown = any(chunk.records is None for chunk in chunks)
    dead = sum(chunk.records or 0 for chunk in chunks)
    if case.readable:
        assert not chunks and read == case.held
    elif case.exact:
        assert not unknown and read + dead == case.held
    else:
        assert unknown or read + dead == case.held
    if case.expect is not None and not case.readable:
        assert read == 0 and {chunk.reason for chunk in chunks} == {reader.SCHEMA_MISMATCH}
        assert all(chunk.detail.startswith("not readable as Report") for chunk in chunks)
    # Every byte of the file is in a chunk or was decoded: chunks never overlap.
    ends = [(chunk.offset, chunk.offset + chunk.length) for chunk in chunks]
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False))


def test_lying_counts_are_dead_lettered_with_the_records_the_block_holds() -> None:
    by_name = {case.name: case for case in CASES}
    for lie in ("understated", "overstated", "zero", "huge"):
        case = by_name[f"null/count-{lie}"]
        read, chunks = _read(case)
        (chunk,) = chunks
        assert chunk.reason == reader.CORRUPT_BLOCK and chunk.records == 50
        assert "hold exactly 50 records" in chunk.detail
        assert read + 50 == case.held


def test_a_truncated_file_reads_its_complete_blocks_and_dead_letters_the_cut_one() -> None:
    case = next(case for case in CASES if case.name == "deflate/truncated-in-data")
    read, chunks = _read(case)
    (chunk,) = chunks
    assert read == 150 and chunk.records == 50 and "truncated" in chunk.detail
    assert chunk.offset + chunk.length == len(case.data)


def test_huge_declared_sizes_allocate_no_more_than_the_file() -> None:
    case = next(case for case in CASES if case.name == "null/size-huge")
    tracemalloc.start()
    try:
        read, chunks = _read(case)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * len(case.data) + (4 << 20)
    # The size runs past the next sync marker: not a cut; reading resumes after that marker.
    (chunk,) = chunks
    assert chunk.records is None and "runs past the next sync marker" in chunk.detail
    assert read == case.held - 50  # only the damaged block (up to its own sync marker)


def test_hostile_schemas_name_the_field_that_does_not_resolve() -> None:
    case = next(case for case in CASES if case.name == "union-mixed/expect")
    _, chunks = _read(case)
    assert "'channel'" in chunks[0].detail and "long" in chunks[0].detail
    assert sum(chunk.records for chunk in chunks) == case.held
    alone = next(case for case in CASES if case.name == "union-mixed/alone")
    _, chunks = _read(alone)
    assert {chunk.reason for chunk in chunks} == {reader.SCHEMA_MISMATCH}
