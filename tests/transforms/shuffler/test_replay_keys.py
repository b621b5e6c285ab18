"""The bucket-wide replay check reads each report piece's replay keys, not its rows
(transforms/shuffler/replays.py): keys name candidates, the candidates are compared exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from transforms.shuffler import replays, spill

SEALED_BYTES = 83


def _sealed(rng: np.random.Generator) -> bytes:
    return bytes([1]) + rng.bytes(SEALED_BYTES - 1)  # the envelope's version byte first


def _rows(payloads: list[bytes], crowds: list[str], first_record: int) -> pa.RecordBatch:
    rows = len(payloads)
    texts = sorted(set(crowds))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)),
            pa.array(np.full(rows, 1_700_000_000_000) + np.arange(rows)),
            pa.array(np.zeros(rows, dtype=np.int64)),
            pa.array(payloads, pa.binary()),
            pa.array(np.zeros(rows, dtype=np.int64)),
            pa.array(first_record + np.arange(rows)),
            pa.DictionaryArray.from_arrays(
                pa.array([texts.index(c) for c in crowds], pa.int32()), pa.array(texts)
            ),
        ],
        schema=spill.REPORT_SPILL_SCHEMA,
    )


def _pieces(path: Path, batches: list[pa.RecordBatch]) -> list[spill.Piece]:
    trailers = [replays.piece_replay_keys(b, [(0, b.num_rows)])[0] for b in batches]
    positions = spill.write_spill(str(path), batches, trailers=trailers)
    return [
        spill.Piece(str(path), offset, length, b.num_rows, "in", 0, len(t) // 12)
        for b, t, (offset, length, _) in zip(batches, trailers, positions, strict=True)
    ]


def test_a_replay_in_another_piece_is_found_and_a_payload_of_another_crowd_is_not(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(4)
    victim, other = _sealed(rng), _sealed(rng)
    first = _rows([victim, other, b"", b"clear"], ["a", "a", "a", "b"], 0)
    # The victim's payload replayed in crowd a (a replay) and sent in crowd b (not one).
    second = _rows([_sealed(rng), victim, victim], ["a", "a", "b"], 100)
    pieces = _pieces(tmp_path / "s.arrow", [first, second])
    assert [piece.sealed for piece in pieces] == [2, 3]
    found = replays.bucket_repeats(pieces)
    assert replays.row_keys(np.array([1]), np.array([101])).tolist() == found[:, 1].tolist()
    hashes = second.column("origin_hash").to_numpy().view(np.int64)
    assert found[:, 0].tolist() == [hashes[1]]


def test_without_a_repeated_key_only_the_keys_are_read(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    batches = [_rows([_sealed(rng) for _ in range(50)], ["a"] * 50, 50 * i) for i in range(3)]
    path = tmp_path / "s.arrow"
    pieces = _pieces(path, batches)
    # Zero every piece's stream, leaving its keys: the check must not need the rows.
    data = bytearray(path.read_bytes())
    for piece in pieces:
        data[piece.offset : piece.offset + piece.length] = bytes(piece.length)
    path.write_bytes(bytes(data))
    assert replays.bucket_repeats(pieces).shape == (0, 2)
    keys, rows = spill.read_replay_keys(pieces[1])
    assert rows.tolist() == list(range(50)) and np.unique(keys).size == 50
