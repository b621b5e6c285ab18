"""Messages the analyzer rejects, per crowd: replays it discards and crowds it must not estimate.

* :class:`FileReplays` finds repeats of a sealed payload within a crowd across the batches of one
  released file (``schemas.replays``: a sealed payload is never sent twice by an honest device).
  The shuffler dead-letters repeats before it counts respondents; this catches any that still
  reach the analyzer (a dishonest or older shuffler). Cost per file of m sealed payloads of L
  bytes read in b batches: memory ``m × (L + 8)`` bytes (the file's sealed payloads, about
  18 MB for the shuffler's largest file of 200,000 messages), time b sorts of at most m keys.
* :func:`rejected_accumulators` turns the rows of a batch that were dead-lettered (unopenable,
  undecodable, replayed) into per-crowd counts of rejections, so that
* :func:`all_rejected_note` can withhold a crowd all of whose messages were rejected: its counts
  are empty, and de-biasing them at its stated n would publish a histogram made of nothing but
  the estimator's offset (every bucket at -n q/(p - q)).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.payloads import EncodedPayloads
from schemas.replays import payload_fingerprints, repeated_sealed_payloads, sealed_rows
from transforms.analyzer.arithmetic.accumulate import (
    HISTOGRAM,
    LONGITUDINAL,
    Accumulator,
    CrowdAccumulator,
    CrowdKey,
    LongitudinalAccumulator,
    RecipeBook,
    is_longitudinal,
)
from transforms.analyzer.arithmetic.batches import crowd_groups, payloads_subset

__all__ = [
    "FileReplays",
    "all_rejected_note",
    "rejected_accumulators",
    "repeats_across_ranges",
]

_KEY_COLUMNS = ("window_start", "window_end", "channel", "recipe_id", "crowd_id")


def _crowd_groups(batch: pa.RecordBatch) -> tuple[np.ndarray, list[tuple]]:
    """A group number per row (rows of one crowd share it) and each group's key values."""
    columns = [batch.column(name) for name in _KEY_COLUMNS]
    order, starts = crowd_groups(columns)
    groups = np.empty(batch.num_rows, dtype=np.int64)
    keys = []
    for number, (begin, end) in enumerate(
        zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)
    ):
        rows = order[begin:end]
        groups[rows] = number
        first = int(rows[0])
        keys.append(tuple(column[first].as_py() for column in columns))
    return groups, keys


def _concat(parts: Sequence[EncodedPayloads]) -> EncodedPayloads:
    data = np.concatenate([part.data[: int(part.offsets[-1])] for part in parts])
    lengths = np.concatenate([part.lengths for part in parts])
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return EncodedPayloads(data, offsets)


def _rows_of(payloads: EncodedPayloads, rows: np.ndarray) -> EncodedPayloads:
    """``payloads_subset`` of ascending ``rows``; all of them (every payload sealed, none
    repeated: the common case) without copying the bytes."""
    return payloads if rows.size == len(payloads) else payloads_subset(payloads, rows)


class FileReplays:
    """Repeats of sealed payloads within a crowd, across the batches of one file (in order)."""

    def __init__(self) -> None:
        self._crowds: dict[tuple, int] = {}
        self._seen_crowds: list[np.ndarray] = []
        self._seen: list[EncodedPayloads] = []

    def repeated(
        self, batch: pa.RecordBatch, payloads: EncodedPayloads | None = None
    ) -> np.ndarray:
        """True for each row of ``batch`` whose sealed payload this file already held in the
        same crowd (earlier in the batch or in an earlier batch); ``payloads``: the batch's
        ``EncodedPayloads.from_arrow`` of its payload column, when the caller has it."""
        repeated = np.zeros(batch.num_rows, dtype=bool)
        if batch.num_rows == 0 or any(n not in batch.schema.names for n in _KEY_COLUMNS):
            return repeated
        if payloads is None:
            payloads = EncodedPayloads.from_arrow(batch.column("payload"))
        sealed = np.flatnonzero(sealed_rows(payloads))
        if sealed.size == 0:
            return repeated
        groups, keys = _crowd_groups(batch)
        codes = np.array([self._crowds.setdefault(k, len(self._crowds)) for k in keys])
        crowds = codes[groups[sealed]]
        mine = _rows_of(payloads, sealed)
        held = sum(part.lengths.size for part in self._seen)
        found = repeated_sealed_payloads(
            np.concatenate([*self._seen_crowds, crowds]), _concat([*self._seen, mine])
        )[held:]
        repeated[sealed[found]] = True
        fresh = np.flatnonzero(~found)
        self._seen_crowds.append(crowds[fresh])
        self._seen.append(_rows_of(mine, fresh))
        return repeated

    def fingerprints(self) -> np.ndarray:
        """``schemas.replays.payload_fingerprints`` of the sealed payloads kept so far (those
        that were no repeat), in no particular order."""
        if not self._seen:
            return np.zeros(0, dtype=np.uint64)
        return np.concatenate([payload_fingerprints(part) for part in self._seen])


def repeats_across_ranges(fingerprints: Sequence[np.ndarray]) -> bool:
    """Whether some fingerprint occurs in two of the ranges (one array per range of a file, each
    :meth:`FileReplays.fingerprints` of that range): then two of its ranges may hold one sealed
    payload, and only a reading of the whole file finds which copy is the repeat."""
    parts = [np.unique(part) for part in fingerprints if part.size]
    if len(parts) < 2:
        return False
    every = np.sort(np.concatenate(parts))
    return bool(np.any(every[1:] == every[:-1]))  # unique within a range: a pair spans two


def rejected_accumulators(
    batch: pa.RecordBatch, rows: np.ndarray, reasons: Sequence[str], book: RecipeBook
) -> dict[CrowdKey, Accumulator]:
    """Empty accumulators holding, per crowd of a known recipe, the rejections of ``batch``'s
    ``rows`` by reason (rows of unknown recipes or unreadable keys count for no crowd)."""
    out: dict[CrowdKey, Accumulator] = {}
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0 or any(name not in batch.schema.names for name in _KEY_COLUMNS):
        return out
    rejected = batch.take(pa.array(rows))
    reasons_array = np.asarray(reasons, dtype=object)
    groups, keys = _crowd_groups(rejected)
    for number, (start, stop, channel, recipe_id, crowd_id) in enumerate(keys):
        recipe = book.get(recipe_id) if recipe_id is not None else None
        if recipe is None or channel != recipe.channel:
            continue
        if not (isinstance(start, int) and isinstance(stop, int) and start < stop):
            continue
        randomizer = recipe.build_randomizer()
        if is_longitudinal(recipe):
            key: CrowdKey = (LONGITUDINAL, 0, stop - start, channel, recipe_id, crowd_id)
            accumulator: Accumulator = LongitudinalAccumulator(
                randomizer.message_domain_size, stop - start
            )
        else:
            key = (HISTOGRAM, start, stop, channel, recipe_id, crowd_id)
            accumulator = CrowdAccumulator.empty(randomizer.message_domain_size, 0)
        names, counts = np.unique(reasons_array[groups == number].astype(str), return_counts=True)
        for reason, count in zip(names.tolist(), counts.tolist(), strict=True):
            accumulator.add_rejected(reason, count)
        if key in out:
            out[key].merge(accumulator)
        else:
            out[key] = accumulator
    return out


def all_rejected_note(key: CrowdKey, accumulator: Accumulator) -> dict[str, Any] | None:
    """A withheld-crowd note when every message of the crowd was rejected (none counted, at
    least one dead-lettered), else None: such a crowd gets no estimate."""
    rejected = dict(accumulator.rejected or {})
    if accumulator.messages or not rejected:
        return None
    kind, window_start, window_end, channel, recipe_id, crowd_id = key
    total = sum(rejected.values())
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(rejected.items()))
    respondents: Mapping = accumulator.respondents
    instances = sorted({k[1] if isinstance(k, tuple) else k for k in respondents})
    return {
        "window_start": int(window_start),
        "window_end": int(window_end),
        "channel": channel,
        "recipe_id": recipe_id,
        "crowd_id": crowd_id,
        "kind": kind,
        "withheld_by": [],
        "released_by": instances,
        "estimated": False,
        "rejected": rejected,
        "note": (
            f"withheld by the analyzer: all {total:,} messages of this crowd were rejected "
            f"({reasons}); no estimate"
        ),
    }
