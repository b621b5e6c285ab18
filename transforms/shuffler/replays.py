"""Replays across the origin shards of one crowd bucket (``schemas/replays.py`` for the why).

A bucket of more than ``messages_per_shard`` messages is counted in 2**b origin shards
(``shuffle.PlanShards``), each holding the messages of some origins only; a replay sent by other
origins than its victim usually lands in another shard. :func:`shard_repeats` decides, for one
shard's rows, which repeat a sealed payload held earlier (by event time, then spill position)
anywhere in the bucket, the same rule ``steps.screen`` applies within one shard, so every shard
of the bucket keeps the same single copy.

Cost per shard of a bucket of m messages, s of them sealed: one more read of the bucket's spill
pieces that hold sealed payloads (pieces without any, ``Piece.sealed == 0``, are not read), 25 bytes per sealed
message for crowd codes, the first 8 bytes of each encapsulated key and event times, one
``O(s log s)`` integer sort, and a third read of the pieces only when some crowd holds two
sealed payloads with equal 8-byte prefixes (a replay, or about s**2 / 2**65 by chance), to
compare those few byte for byte.
"""

from __future__ import annotations

import numpy as np

from schemas.payloads import EncodedPayloads
from schemas.replays import repeated_sealed_payloads, sealed_rows
from transforms.shuffler import report_rows, spill

__all__ = ["shard_repeats"]

_PREFIX = np.arange(9, 17)  # the first 8 bytes of the encapsulated key (enc)


def _crowd_codes(column, codes: dict[str, int]) -> np.ndarray:
    texts = column.dictionary.to_pylist()
    mapped = np.array([codes.setdefault(text, len(codes)) for text in texts], dtype=np.int64)
    return mapped[column.indices.to_numpy(zero_copy_only=False)]


def shard_repeats(task: spill.ShardTask, piece_index: np.ndarray) -> np.ndarray:
    """True for each row of ``task``'s shard (in ``spill.read_shard_rows`` order, whose
    ``piece_index`` column is given) whose sealed payload an earlier row of the bucket holds in
    the same crowd (see the module docstring)."""
    pieces = spill.read_piece_list(task.piece_list)
    crowd_codes: dict[str, int] = {}
    columns: dict[str, list[np.ndarray]] = {
        name: [] for name in ("piece", "row", "crowd", "prefix", "time", "mine")
    }
    shard_rows = 0
    rows_per_piece = np.bincount(piece_index, minlength=len(pieces)).tolist()
    for index, piece in enumerate(pieces):
        if piece.sealed == 0:  # no sealed payload here: nothing to read
            shard_rows += rows_per_piece[index]
            continue
        batch = spill.read_spill(piece, spill.REPORT_SPILL_SCHEMA)
        begin, end = report_rows.shard_row_range(
            batch.column("origin_hash").to_numpy(), task.shard, task.bits
        )
        mine_offset = shard_rows - begin  # shard position of row r of this piece: r + offset
        shard_rows += end - begin
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
        mine = np.full(rows.size, -1, dtype=np.int64)
        inside = (rows >= begin) & (rows < end)
        mine[inside] = rows[inside] + mine_offset
        columns["mine"].append(mine)
    repeated = np.zeros(shard_rows, dtype=bool)
    if not columns["row"]:
        return repeated
    piece, row, crowd, prefix, time, mine = (np.concatenate(columns[n]) for n in columns)
    by_prefix = np.lexsort((prefix, crowd))
    same = (crowd[by_prefix][1:] == crowd[by_prefix][:-1]) & (
        prefix[by_prefix][1:] == prefix[by_prefix][:-1]
    )
    if not same.any():
        return repeated
    candidate = np.zeros(row.size, dtype=bool)
    candidate[by_prefix[1:][same]] = True
    candidate[by_prefix[:-1][same]] = True
    chosen = np.flatnonzero(candidate)
    # The candidates' bytes, read again piece by piece (few: replays, or chance equal prefixes).
    payloads: list[bytes] = [b""] * chosen.size
    for index in np.unique(piece[chosen]).tolist():
        at = chosen[piece[chosen] == index]
        column = spill.read_spill(pieces[index], spill.REPORT_SPILL_SCHEMA).column("payload")
        for position, value in zip(at.tolist(), column.take(row[at]).to_pylist(), strict=True):
            payloads[int(np.searchsorted(chosen, position))] = value
    # First copy: earliest event time, then spill position (as steps.screen within one shard).
    order = np.empty(chosen.size, dtype=np.int64)
    order[np.lexsort((row[chosen], piece[chosen], time[chosen]))] = np.arange(chosen.size)
    found = repeated_sealed_payloads(crowd[chosen], payloads, order)
    ours = mine[chosen]
    repeated[ours[found & (ours >= 0)]] = True
    return repeated
