"""Fenced report pieces (transforms/shuffler/spill.py): an origin shard reads only the chunks its
hash range touches, gets exactly the rows a full read would give it, and a bucket's shards
together read each piece about once whatever their number."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from transforms.shuffler import report_rows, spill

ROWS = 5_000
CHUNK = 256


def _report_batch(rows: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    hashes = np.sort(rng.integers(0, 2**64, size=rows, dtype=np.uint64))
    hashes[10:14] = hashes[10]  # one origin's messages may straddle a chunk boundary
    texts = pa.array([spill.crowd_text("ch", "r@1", name) for name in ("a", "b", None)])
    crowds = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, 3, rows, dtype=np.int32)), texts
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(hashes),
            pa.array(rng.integers(0, 10**12, rows)),
            pa.array(np.full(rows, 5)),
            pa.array([bytes([2 * (i % 100)]) * (i % 40) for i in range(rows)], pa.binary()),
            pa.array(rng.integers(0, 2**32, rows)),
            pa.array(np.arange(rows)),
            crowds,
        ],
        schema=spill.REPORT_SPILL_SCHEMA,
    )


@pytest.fixture
def pieces(tmp_path: Path) -> list[spill.Piece]:
    batches = [_report_batch(ROWS, 1), _report_batch(CHUNK - 3, 2), _report_batch(ROWS // 3, 3)]
    path = str(tmp_path / "reports.arrow")
    written = spill.write_spill(path, batches, CHUNK)
    return [
        spill.Piece(path, at.offset, at.length, batch.num_rows, "src", 5, 0, at.fences)
        for batch, at in zip(batches, written, strict=True)
    ]


@pytest.mark.parametrize("bits", [0, 1, 3, 6, 10])
def test_a_shard_reads_the_rows_a_full_read_gives_it(pieces, bits: int) -> None:
    for piece in pieces:
        whole = spill.read_spill(piece, spill.REPORT_SPILL_SCHEMA)
        assert whole.num_rows == piece.rows
        assert bool(piece.fences) == (piece.rows > CHUNK)
        hashes = whole.column("origin_hash").to_numpy()
        got = 0
        for shard in range(1 << bits):
            begin, end = report_rows.shard_row_range(hashes, shard, bits)
            rows = spill.read_shard_range(piece, shard, bits)
            assert rows.equals(whole.slice(begin, end - begin))
            got += rows.num_rows
        assert got == piece.rows


def test_shards_together_read_a_piece_about_once(pieces, monkeypatch) -> None:
    """8 shards of a 5,000-row piece in 20 chunks of 256 rows: the bytes read are the piece once,
    plus per shard its stream head and at most the two chunks its range shares with its
    neighbours (a shard of fewer rows than a chunk reads a whole chunk)."""
    read: list[int] = []
    original = spill._read_ranges

    def counting(path: str, ranges: list[tuple[int, int]], *files) -> memoryview:
        read.append(sum(end - begin for begin, end in ranges))
        return original(path, ranges, *files)

    monkeypatch.setattr(spill, "_read_ranges", counting)
    piece = pieces[0]
    fences = spill.unpack_ints(piece.fences)
    head = int(fences[0, 2])
    largest_chunk = int((fences[:, 3] - fences[:, 2]).max())
    # The head every shard reads holds the schema and dictionaries, not the piece's rows.
    assert head < largest_chunk
    bits = 3
    for shard in range(1 << bits):
        spill.read_shard_range(piece, shard, bits)
    assert len(read) == 1 << bits
    assert sum(read) <= piece.length + (1 << bits) * (head + 2 * largest_chunk)
    # Reading the piece in full once per shard would cost 8 times the piece.
    assert sum(read) < 2 * piece.length


def test_a_bundles_shards_read_through_its_open_files_as_alone(pieces, tmp_path: Path) -> None:
    """Shards read through one bundle's open spill files (spill.OpenSpill) get the rows each
    gets on its own, the bundle opens each file once, and none stays open after close()."""
    second = str(tmp_path / "second.arrow")
    (at,) = spill.write_spill(second, [_report_batch(ROWS // 2, 4)], CHUNK)
    pieces = [
        *pieces,
        spill.Piece(second, at.offset, at.length, ROWS // 2, "other", 5, 0, at.fences),
    ]
    piece_list = spill.write_piece_list(str(tmp_path / "spill"), tuple(pieces))
    bits = 3
    files = spill.OpenSpill()
    opened: list[str] = []
    descriptor = files.descriptor

    def counting(path: str) -> int:
        if path not in files._files:
            opened.append(path)
        return descriptor(path)

    files.descriptor = counting
    held = []
    for shard in range(1 << bits):
        task = spill.ShardTask(shard, bits, piece_list)
        alone, sources = spill.read_shard_rows(task, ["origin_hash", "payload", "crowd"])
        shared, shared_sources = spill.read_shard_rows(
            task, ["origin_hash", "payload", "crowd"], files
        )
        assert shared.equals(alone) and shared_sources == sources == ["src"] * 3 + ["other"]
        # Against each piece's own shard range, in piece order.
        parts = [spill.read_shard_range(piece, shard, bits) for piece in pieces]
        for name in ("origin_hash", "payload", "crowd"):
            expected = [value for part in parts for value in part.column(name).to_pylist()]
            assert shared.column(name).to_pylist() == expected
        numbers = [index for index, part in enumerate(parts) for _ in range(part.num_rows)]
        assert shared.column(spill.PIECE_INDEX).to_pylist() == numbers
        held.append(alone.num_rows)
    assert sum(held) == sum(piece.rows for piece in pieces)
    assert sorted(opened) == sorted({piece.path for piece in pieces})
    open_descriptors = list(files._files.values())
    files.close()
    for number in open_descriptors:
        with pytest.raises(OSError):
            os.fstat(number)


def test_a_bundle_holds_at_most_its_limit_of_spill_files_open(tmp_path: Path) -> None:
    """With more spill files than the limit, the oldest open one is closed to make room: reads
    still give every piece's rows, and no more than ``limit`` files are open at any time."""
    batches = [_report_batch(CHUNK * 2, seed) for seed in range(5)]
    pieces = []
    for index, batch in enumerate(batches):
        path = str(tmp_path / f"reports-{index}.arrow")
        (at,) = spill.write_spill(path, [batch], CHUNK)
        pieces.append(spill.Piece(path, at.offset, at.length, batch.num_rows, "s", 5, 0, at.fences))
    piece_list = spill.write_piece_list(str(tmp_path / "spill"), tuple(pieces))
    files = spill.OpenSpill(limit=2)
    for shard in range(4):
        rows, _ = spill.read_shard_rows(
            spill.ShardTask(shard, 2, piece_list), ["origin_hash"], files
        )
        alone, _ = spill.read_shard_rows(spill.ShardTask(shard, 2, piece_list), ["origin_hash"])
        assert rows.equals(alone)
        assert len(files._files) == 2
    files.close()
    assert not files._files


def test_a_local_spill_file_holds_the_streams_a_remote_one_would(tmp_path: Path) -> None:
    """Local spill files are written straight through a buffer; other file systems get each
    stream made in memory (``spill._stream``). Both give the same bytes, positions and fences,
    and a trailer follows its stream outside the stream's length."""
    batches = [_report_batch(ROWS, 4), _report_batch(CHUNK // 2, 5)]
    trailers = [b"\x01" * 24, b""]
    path = tmp_path / "local.arrow"
    written = spill.write_spill(str(path), batches, CHUNK, trailers)
    expected, offset = b"", 0
    for batch, trailer, at in zip(batches, trailers, written, strict=True):
        stream, fences = spill._stream(batch, CHUNK)
        assert (at.offset, at.length, at.fences) == (offset, stream.size, fences)
        expected += stream.to_pybytes() + trailer
        offset += stream.size + len(trailer)
    assert path.read_bytes() == expected
    assert written[0].fences  # the big batch is chunked
