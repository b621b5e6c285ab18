"""Replays across the origin shards of one crowd bucket (``schemas/replays.py`` for the why).

A bucket of more than ``messages_per_shard`` messages is counted in 2**b origin shards
(``shuffle.PlanShards``), each holding the messages of some origins only; a replay sent by other
origins than its victim usually lands in another shard. :func:`bucket_repeats` finds, once per
bucket (in ``PlanShards``), the rows that repeat a sealed payload held earlier (by event time,
then spill position) anywhere in the bucket, the same rule ``steps.screen`` applies within one
shard; each shard gets its own repeats in its task (:func:`shard_repeat_keys`) and marks them
(:func:`shard_repeats`), so every shard of the bucket keeps the same single copy.

The work per message is done where the messages are spread, not per bucket: ``SpillBatch``
writes after each report piece its replay keys (:func:`piece_replay_keys`), one uint64 per
sealed row (the payload's fingerprint, ``schemas.replays.payload_fingerprints``, mixed with a
64-bit hash of its crowd) and its position. Per bucket of m messages, s of them sealed,
:func:`bucket_repeats` then reads 12 bytes per sealed message (pieces without any,
``Piece.sealed == 0``, not at all), sorts the s keys once (``O(s log s)``, integers), and reads
pieces again only when two keys are equal (a replay, or about s**2 / 2**65 by chance), to compare
those few payloads byte for byte with their crowds. A key names candidates only: equal payloads
of one crowd have equal keys, and every candidate is checked exactly, so a collision costs a
comparison, never a message. The shards read nothing more.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from schemas.payloads import EncodedPayloads
from schemas.replays import payload_fingerprints, repeated_sealed_payloads, sealed_rows
from transforms.shuffler import spill

__all__ = ["bucket_repeats", "piece_replay_keys", "shard_repeat_keys", "shard_repeats"]

# A row of a bucket is named by (its piece's index in the bucket's list, its record_index):
# one int64, the record index in the low bits (an input file holds fewer than 2**40 records).
_RECORD_BITS = 40
_EMPTY = np.zeros((0, 2), dtype=np.int64)


def _crowd_codes(column, codes: dict[str, int]) -> np.ndarray:
    texts = column.dictionary.to_pylist()
    mapped = np.array([codes.setdefault(text, len(codes)) for text in texts], dtype=np.int64)
    return mapped[column.indices.to_numpy(zero_copy_only=False)]


def _crowd_mixes(dictionary: pa.Array) -> np.ndarray:
    """A 64-bit hash (BLAKE2b) of each crowd text of a dictionary, to mix into replay keys."""
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            for text in dictionary.to_pylist()
        ],
        dtype=np.uint64,
    )


def piece_replay_keys(rows: pa.RecordBatch, bounds: list[tuple[int, int]]) -> list[bytes]:
    """The replay keys (``spill.replay_key_bytes``) of each piece ``rows[begin:end]`` of a
    batch of spill rows: for each sealed row, its payload's fingerprint XOR its crowd's hash,
    and its position in the piece (empty bytes: no sealed row)."""
    payloads = EncodedPayloads.from_arrow(rows.column("payload"))
    sealed = np.flatnonzero(sealed_rows(payloads))
    if not sealed.size:
        return [b""] * len(bounds)
    crowd = rows.column("crowd")
    indices = crowd.indices.to_numpy(zero_copy_only=False)[sealed]
    keys = payload_fingerprints(payloads) ^ _crowd_mixes(crowd.dictionary)[indices]
    out = []
    for begin, end in bounds:
        first, last = np.searchsorted(sealed, [begin, end])
        if first == last:
            out.append(b"")
        else:
            out.append(spill.replay_key_bytes(keys[first:last], sealed[first:last] - begin))
    return out


def row_keys(piece_index: np.ndarray, record_index: np.ndarray) -> np.ndarray:
    """One int64 per row naming it within its bucket (see ``_RECORD_BITS``)."""
    return (np.asarray(piece_index, np.int64) << _RECORD_BITS) | np.asarray(record_index, np.int64)


def _replay_keys(piece: spill.Piece) -> tuple[np.ndarray, np.ndarray]:
    """A report piece's replay keys: its trailer, or, where its sealed rows were not counted
    (``sealed == -1``), made from its rows."""
    if piece.sealed > 0:
        return spill.read_replay_keys(piece)
    batch = spill.read_spill(piece, spill.REPORT_SPILL_SCHEMA)
    return spill.replay_keys_of(piece_replay_keys(batch, [(0, batch.num_rows)])[0])


def bucket_repeats(pieces: list[spill.Piece]) -> np.ndarray:
    """The rows of a bucket (its pieces, in list order) whose sealed payload an earlier row of
    the bucket holds in the same crowd: an ``(n, 2)`` int64 array of (origin hash as int64 bits,
    :func:`row_keys`) (see the module docstring)."""
    piece_parts, row_parts, key_parts = [], [], []
    for index, piece in enumerate(pieces):
        if piece.sealed == 0:  # no sealed payload here: nothing to read
            continue
        keys, rows = _replay_keys(piece)
        piece_parts.append(np.full(rows.size, index, dtype=np.int64))
        row_parts.append(rows)
        key_parts.append(keys)
    if not row_parts:
        return _EMPTY
    piece, row, key = (np.concatenate(parts) for parts in (piece_parts, row_parts, key_parts))
    # The keys that occur twice or more, then the rows holding them: a sort and a search, about
    # half an argsort's time (0.044-0.068 s against 0.09 s for 1.9 M keys), in a step that runs
    # once per bucket, on one worker, while the others wait.
    sorted_keys = np.sort(key)
    same = sorted_keys[1:] == sorted_keys[:-1]
    if not same.any():
        return _EMPTY
    repeated = np.unique(sorted_keys[1:][same])
    nearest = np.minimum(np.searchsorted(repeated, key), repeated.size - 1)
    chosen = np.flatnonzero(repeated[nearest] == key)
    # The candidates' bytes, crowds, times, hashes and record indices, read again piece by piece
    # (few: replays, or chance equal keys).
    payloads: list[bytes] = [b""] * chosen.size
    crowd = np.zeros(chosen.size, dtype=np.int64)
    time = np.zeros(chosen.size, dtype=np.int64)
    hashes = np.zeros(chosen.size, dtype=np.int64)
    records = np.zeros(chosen.size, dtype=np.int64)
    crowd_codes: dict[str, int] = {}
    for index in np.unique(piece[chosen]).tolist():
        at = np.flatnonzero(piece[chosen] == index)
        batch = spill.read_spill(pieces[index], spill.REPORT_SPILL_SCHEMA)
        take = pa.array(row[chosen][at])
        for position, value in zip(
            at.tolist(), batch.column("payload").take(take).to_pylist(), strict=True
        ):
            payloads[position] = value
        crowd[at] = _crowd_codes(batch.column("crowd").take(take), crowd_codes)
        time[at] = batch.column("event_time").take(take).to_numpy()
        hashes[at] = batch.column("origin_hash").take(take).to_numpy().view(np.int64)
        records[at] = batch.column("record_index").take(take).to_numpy()
    # First copy: earliest event time, then spill position (as steps.screen within one shard).
    order = np.empty(chosen.size, dtype=np.int64)
    order[np.lexsort((row[chosen], piece[chosen], time))] = np.arange(chosen.size)
    found = repeated_sealed_payloads(crowd, payloads, order)
    return np.stack([hashes[found], row_keys(piece[chosen][found], records[found])], axis=1)


def shard_repeat_keys(repeats: np.ndarray, shard: int, bits: int) -> bytes:
    """The row keys of ``repeats`` (:func:`bucket_repeats`) in origin shard ``shard`` of
    2**bits, packed (``spill.pack_ints``; empty: none)."""
    if not repeats.size:
        return b""
    top = repeats[:, 0].view(np.uint64) >> np.uint64(64 - bits)
    keys = repeats[top == shard, 1]
    return spill.pack_ints(np.sort(keys)) if keys.size else b""


def shard_repeats(
    repeat_keys: bytes, piece_index: np.ndarray, record_index: np.ndarray
) -> np.ndarray:
    """True for each row of a shard (its ``piece_index`` and ``record_index`` columns) that
    :func:`shard_repeat_keys` named."""
    if not repeat_keys:
        return np.zeros(len(piece_index), dtype=bool)
    return np.isin(row_keys(piece_index, record_index), spill.unpack_ints(repeat_keys))
