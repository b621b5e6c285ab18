"""Opening sealed payloads in the analyzer, on whole batches (``schemas.crypto.sealing``).

The device side (padding, sealing, chaff) is ``simulators.sealing``.

Analyzer side, :class:`ReleaseOpener` opens a batch of ShuffledMessage rows before payload
decoding: it returns the batch with opened (unpadded) payloads and their CRC32C for the rows that
opened, drops chaff (counted as ``chaff``) and returns the rows that failed with their reason
(``schemas.crypto.sealing.OPEN_REASONS``). Rows whose stored CRC32C does not match their sealed bytes,
and empty payloads, pass through untouched so the decoder keeps its own verdict on them. The key
ring is loaded from its path by :meth:`ReleaseOpener.load` on the worker (``DoFn.setup``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from schemas.avro.crc32c import crc32c_many
from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import KeyRing, PublicKeyInfo
from schemas.crypto.sealing import recipe_pad_length
from schemas.payloads import EncodedPayloads
from schemas.recipes import Recipe

__all__ = [
    "OpenedBatch",
    "ReleaseOpener",
    "seal_fixed",
    "open_in_window",
]


@dataclass(frozen=True)
class OpenedBatch:
    """A batch after opening: ``columns`` (opened and pass-through rows, in input order) and the
    rejected rows of the input with their reasons; ``counts`` has read/chaff/rejected:<reason>."""

    columns: pa.RecordBatch
    kept_rows: np.ndarray
    rejected_rows: np.ndarray
    rejected_reasons: list[str]
    counts: Mapping[str, int]


class ReleaseOpener:
    """Opens sealed ShuffledMessage payloads with the analyzer's key ring (worker side).

    Without a ring (``ring=None``, payloads expected in the clear) it only refuses payloads that
    look sealed (``schemas.crypto.sealing.looks_sealed``), as ``sealed_without_key_ring``.
    """

    def __init__(
        self,
        ring: KeyRing | None,
        recipes: Mapping[str, Recipe],
        pads: Mapping[str, int] | None = None,
    ) -> None:
        self.ring = ring
        self._pads = {recipe_id: recipe_pad_length(r) for recipe_id, r in recipes.items()}
        self._pads.update(pads or {})  # channels without a Recipe (esa train's epochs)

    @classmethod
    def load(cls, key_ring_path: str | None, recipes: Mapping[str, Recipe]) -> ReleaseOpener:
        """Read the private keys from their path (call this on the worker, in DoFn.setup)."""
        return cls(KeyRing.load(key_ring_path) if key_ring_path else None, recipes)

    def open_batch(
        self, batch: pa.RecordBatch, encoded: EncodedPayloads | None = None
    ) -> OpenedBatch:
        """``encoded``: ``EncodedPayloads.from_arrow`` of the payload column, when the caller
        has it."""
        rows = batch.num_rows
        payload_column = batch.column("payload")
        stored = batch.column("payload_crc32c").fill_null(-1).to_numpy(zero_copy_only=False)
        if encoded is None:
            encoded = EncodedPayloads.from_arrow(payload_column)
        lengths = encoded.lengths
        status = np.zeros(rows, dtype=np.uint8)
        if self.ring is None:
            first = np.zeros(rows, dtype=np.uint8)
            first[lengths > 0] = encoded.data[encoded.offsets[:-1][lengths > 0]]
            refused = sealing.looks_sealed(first, lengths)
            if refused.any():  # (clear payloads need no CRC32C here: the decoder checks it)
                refused &= crc32c_many(encoded).astype(np.int64) == stored
            status[refused] = sealing.NO_KEY_RING
            return _finish(batch, status, None, refused, stored)
        actual = crc32c_many(encoded).astype(np.int64)
        # Rows left to the decoder as they are: empty payloads, CRC mismatches, unknown recipes.
        candidate = (lengths > 0) & (actual == stored)
        payloads = payload_column.to_pylist()
        opened: list[bytes] = list(payloads)
        keys = ["window_start", "window_end", "channel", "recipe_id", "crowd_id"]
        table = pa.table({**{k: batch.column(k) for k in keys}, "_row": np.arange(rows)})
        table = table.filter(pa.array(candidate))
        groups = table.group_by(keys, use_threads=False).aggregate([("_row", "list")])
        for group in groups.to_pylist():
            pad_to = self._pads.get(group["recipe_id"])
            if pad_to is None:
                continue  # unknown recipe: the decoder dead-letters it
            members = group["_row_list"]
            result = sealing.open_sealed(
                self.ring,
                [payloads[r] for r in members],
                pad_to,
                group["recipe_id"],
                group["channel"],
                int(group["window_start"]),
                int(group["window_end"]),
                group["crowd_id"],
            )
            status[members] = result.status
            for row, plaintext in zip(members, result.payloads, strict=True):
                opened[row] = plaintext
        return _finish(batch, status, opened, candidate, stored)


def _finish(
    batch: pa.RecordBatch,
    status: np.ndarray,
    opened: list[bytes] | None,
    candidate: np.ndarray,
    stored: np.ndarray,
) -> OpenedBatch:
    """Drop chaff and rejected rows; put opened payloads and their CRC32C in place."""
    rows = batch.num_rows
    keep = status == sealing.OK
    kept_rows = np.flatnonzero(keep)
    rejected = np.flatnonzero(status > sealing.CHAFF)
    reasons = np.asarray(sealing.OPEN_REASONS, dtype=object)[status[rejected]]
    counts: dict[str, int] = {}
    chaff = int(np.count_nonzero(status == sealing.CHAFF))
    if rows - kept_rows.size:
        counts["read"] = rows - int(kept_rows.size)
    if chaff:
        counts["chaff"] = chaff
    for reason, count in zip(*np.unique(reasons.astype(str), return_counts=True), strict=True):
        counts[f"rejected:{reason}"] = int(count)
    columns = batch if kept_rows.size == rows else batch.take(pa.array(kept_rows))
    if opened is not None:
        kept_payloads = EncodedPayloads.from_list([opened[r] for r in kept_rows.tolist()])
        crc = crc32c_many(kept_payloads).astype(np.int64)
        passed = ~candidate[kept_rows]  # untouched rows keep their stored CRC32C
        crc[passed] = stored[kept_rows][passed]
        columns = columns.set_column(
            columns.schema.get_field_index("payload"),
            "payload",
            kept_payloads.to_arrow().cast(batch.column("payload").type),
        )
        columns = columns.set_column(
            columns.schema.get_field_index("payload_crc32c"),
            "payload_crc32c",
            pa.array(crc, type=batch.column("payload_crc32c").type),
        )
    return OpenedBatch(columns, kept_rows, rejected, list(reasons), counts)


# -- one channel, one window (esa train's epochs: schemas.ldp_sgd payloads, no Recipe) --------


def seal_fixed(
    public_key_json: str,
    payloads: pa.BinaryArray,
    pad_to: int,
    recipe_id: str,
    channel: str,
    window: tuple[int, int],
) -> pa.BinaryArray:
    """Seal payloads of one channel and window (no crowd id) to the analyzer's public key."""
    sealer = sealing.Sealer(PublicKeyInfo.from_json(public_key_json, "public key"))
    info = sealer.info(recipe_id, channel, int(window[0]), int(window[1]), None)
    plain = payloads.to_pylist()
    return pa.array(sealer.seal_many(plain, [info] * len(plain), pad_to), pa.binary())


def open_in_window(
    opener: ReleaseOpener, columns: pa.RecordBatch, window: tuple[int, int]
) -> OpenedBatch:
    """:meth:`ReleaseOpener.open_batch` for messages read without their window and crowd
    columns, all of one known window and no crowd id (a Report file, or a release read with a
    narrower schema)."""
    rows = columns.num_rows
    given = {
        "window_start": pa.array(np.full(rows, int(window[0]), dtype=np.int64)),
        "window_end": pa.array(np.full(rows, int(window[1]), dtype=np.int64)),
        "crowd_id": pa.nulls(rows, pa.string()),
    }
    for name, column in given.items():
        if columns.schema.get_field_index(name) < 0:
            columns = columns.append_column(name, column)
    return opener.open_batch(columns)
