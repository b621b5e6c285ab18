"""Replays across the origin shards of one crowd bucket (``schemas/replays.py`` for the why).

A bucket of more than ``messages_per_shard`` messages is counted in 2**b origin shards
(``shuffle.PlanShards``), each holding the messages of some origins only; a replay sent by other
origins than its victim usually lands in another shard. :func:`bucket_repeats` finds, once per
bucket (in ``PlanShards``), the rows that repeat a sealed payload held earlier (by event time,
then spill position) anywhere in the bucket, the same rule ``steps.screen`` applies within one
shard; each shard gets its own repeats in its task (:func:`shard_repeat_keys`) and marks them
(:func:`shard_repeats`), so every shard of the bucket keeps the same single copy.

Cost per bucket of m messages, s of them sealed: one read of its spill pieces that hold sealed
payloads (pieces without any, ``Piece.sealed == 0``, are not read), 25 bytes per sealed message
for crowd codes, the first 8 bytes of each encapsulated key and event times, one
``O(s log s)`` integer sort, and a second read of the pieces only when some crowd holds two
sealed payloads with equal 8-byte prefixes (a replay, or about s**2 / 2**65 by chance), to
compare those few byte for byte. The shards read nothing more.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from schemas.payloads import EncodedPayloads
from schemas.replays import repeated_sealed_payloads, sealed_rows
from transforms.shuffler import spill

__all__ = ["bucket_repeats", "shard_repeat_keys", "shard_repeats"]

_PREFIX = np.arange(9, 17)  # the first 8 bytes of the encapsulated key (enc)
# A row of a bucket is named by (its piece's index in the bucket's list, its record_index):
# one int64, the record index in the low bits (an input file holds fewer than 2**40 records).
_RECORD_BITS = 40
_EMPTY = np.zeros((0, 2), dtype=np.int64)


def _crowd_codes(column, codes: dict[str, int]) -> np.ndarray:
    texts = column.dictionary.to_pylist()
    mapped = np.array([codes.setdefault(text, len(codes)) for text in texts], dtype=np.int64)
    return mapped[column.indices.to_numpy(zero_copy_only=False)]


def row_keys(piece_index: np.ndarray, record_index: np.ndarray) -> np.ndarray:
    """One int64 per row naming it within its bucket (see ``_RECORD_BITS``)."""
    return (np.asarray(piece_index, np.int64) << _RECORD_BITS) | np.asarray(record_index, np.int64)


def bucket_repeats(pieces: list[spill.Piece]) -> np.ndarray:
    """The rows of a bucket (its pieces, in list order) whose sealed payload an earlier row of
    the bucket holds in the same crowd: an ``(n, 2)`` int64 array of (origin hash as int64 bits,
    :func:`row_keys`) (see the module docstring)."""
    crowd_codes: dict[str, int] = {}
    columns: dict[str, list[np.ndarray]] = {
        name: [] for name in ("piece", "row", "crowd", "prefix", "time")
    }
    for index, piece in enumerate(pieces):
        if piece.sealed == 0:  # no sealed payload here: nothing to read
            continue
        batch = spill.read_spill(piece, spill.REPORT_SPILL_SCHEMA)
        payloads = EncodedPayloads.from_arrow(batch.column("payload"))
        rows = np.flatnonzero(sealed_rows(payloads))
        if not rows.size:
            continue
        prefix = payloads.data[payloads.offsets[:-1][rows][:, None] + _PREFIX]
        columns["piece"].append(np.full(rows.size, index, dtype=np.int64))
        columns["row"].append(rows)
        columns["crowd"].append(_crowd_codes(batch.column("crowd"), crowd_codes)[rows])
        columns["prefix"].append(np.ascontiguousarray(prefix).view(np.uint64).ravel())
        columns["time"].append(batch.column("event_time").to_numpy()[rows])
    if not columns["row"]:
        return _EMPTY
    piece, row, crowd, prefix, time = (np.concatenate(columns[n]) for n in columns)
    by_prefix = np.lexsort((prefix, crowd))
    same = (crowd[by_prefix][1:] == crowd[by_prefix][:-1]) & (
        prefix[by_prefix][1:] == prefix[by_prefix][:-1]
    )
    if not same.any():
        return _EMPTY
    candidate = np.zeros(row.size, dtype=bool)
    candidate[by_prefix[1:][same]] = True
    candidate[by_prefix[:-1][same]] = True
    chosen = np.flatnonzero(candidate)
    # The candidates' bytes, hashes and record indices, read again piece by piece (few:
    # replays, or chance equal prefixes).
    payloads: list[bytes] = [b""] * chosen.size
    hashes = np.zeros(chosen.size, dtype=np.int64)
    records = np.zeros(chosen.size, dtype=np.int64)
    for index in np.unique(piece[chosen]).tolist():
        at = np.flatnonzero(piece[chosen] == index)
        batch = spill.read_spill(pieces[index], spill.REPORT_SPILL_SCHEMA)
        take = pa.array(row[chosen][at])
        for position, value in zip(
            at.tolist(), batch.column("payload").take(take).to_pylist(), strict=True
        ):
            payloads[position] = value
        hashes[at] = batch.column("origin_hash").take(take).to_numpy().view(np.int64)
        records[at] = batch.column("record_index").take(take).to_numpy()
    # First copy: earliest event time, then spill position (as steps.screen within one shard).
    order = np.empty(chosen.size, dtype=np.int64)
    order[np.lexsort((row[chosen], piece[chosen], time[chosen]))] = np.arange(chosen.size)
    found = repeated_sealed_payloads(crowd[chosen], payloads, order)
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
