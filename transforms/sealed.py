"""Sealing on the device and opening in the analyzer, on whole batches (``schemas.sealing``).

Device side, :class:`DeviceSealing` turns a ``ReportBatch`` of plaintext payloads into one with
sealed payloads: every non-empty payload padded to the recipe's one length and sealed to the
analyzer's public key, bound to recipe, channel, window and crowd id; empty payloads (presence)
left alone; chaff added at the recipe's ``chaff_rate``, anchored on the presence messages (one
per device, recipe window and instance, whatever the device's data): per presence message
``floor(rate)`` cover messages plus one more with probability ``rate - floor(rate)``, at most
``Recipe.chaff_allowance``, which the shuffler's per-origin cap adds
(``transforms/release_core.py``), each with its own event time drawn uniformly in the window
like a data message's and the recipe's one sealed length; rows permuted so that
position in the batch says nothing about which rows are chaff. CRC32C is recomputed over the
sealed bytes (what the shuffler checks and forwards).

Analyzer side, :class:`ReleaseOpener` opens a batch of ShuffledMessage rows before payload
decoding: it returns the batch with opened (unpadded) payloads and their CRC32C for the rows that
opened, drops chaff (counted as ``chaff``) and returns the rows that failed with their reason
(``schemas.sealing.OPEN_REASONS``). Rows whose stored CRC32C does not match their sealed bytes,
and empty payloads, pass through untouched so the decoder keeps its own verdict on them. The key
ring is loaded from its path by :meth:`ReleaseOpener.load` on the worker (``DoFn.setup``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from privacy.rng import secure_generator
from schemas import sealing
from schemas.avro.crc32c import crc32c_many
from schemas.keys import SUITE_NAME, KeyRing, PublicKeyInfo
from schemas.payloads import EncodedPayloads, payload_limits
from schemas.recipes import Recipe

__all__ = [
    "recipe_pad_length",
    "chaff_rate",
    "DeviceSealing",
    "chaff_allowance",
    "sealing_metadata",
    "sealing_for",
    "OpenedBatch",
    "ReleaseOpener",
    "seal_fixed",
    "open_in_window",
]


def recipe_pad_length(recipe: Recipe) -> int:
    """The one plaintext length every sealed message of ``recipe`` is padded to."""
    return sealing.padded_length(recipe.payload_kind, payload_limits(recipe.build_randomizer()))


def chaff_rate(recipe: Recipe) -> float:
    """Cover messages per device, crowd and instance (the recipe's ``chaff_rate``, default 0)."""
    return float(recipe.chaff_rate)


def chaff_allowance(recipe: Recipe) -> int:
    """The most chaff messages one device sends per crowd and instance: ``ceil(chaff_rate)``
    (what a shuffler's per-origin cap must allow on top of the data messages)."""
    return int(recipe.chaff_allowance)


class DeviceSealing:
    """Seals ``ReportBatch`` payloads of one recipe for one analyzer key (device side)."""

    def __init__(
        self,
        recipe: Recipe,
        public: PublicKeyInfo,
        window_ms: int,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.recipe = recipe
        self.sealer = sealing.Sealer(public)
        self.window_ms = int(window_ms)
        self.pad_to = recipe_pad_length(recipe)
        self.chaff_rate = chaff_rate(recipe)
        # Chaff counts, chaff times and row order: seeded from the OS CSPRNG unless injected.
        self.rng = rng if rng is not None else secure_generator()

    @staticmethod
    def _presence_rows(payloads: list[bytes]) -> np.ndarray:
        """The presence messages (empty payloads): one per device, recipe window and instance,
        whatever the device's data, so chaff anchored on them says nothing about the data."""
        return np.fromiter((not p for p in payloads), dtype=bool, count=len(payloads))

    def seal_batch(self, batch: Any) -> Any:
        """A ``ReportBatch`` with sealed payloads and chaff (``dataclasses.replace``)."""
        payloads = batch.payloads.to_list()
        times = np.asarray(batch.event_time_ms, dtype=np.int64)
        origin = batch.origin
        anchors = np.flatnonzero(self._presence_rows(payloads))
        whole = math.floor(self.chaff_rate)
        chaff_counts = np.full(anchors.size, whole, dtype=np.int64)
        if self.chaff_rate > whole:
            chaff_counts += self.rng.random(anchors.size) < self.chaff_rate - whole
        chaff_rows = np.repeat(anchors, chaff_counts)
        window_of = (times // self.window_ms) * self.window_ms
        chaff_times = window_of[chaff_rows] + self.rng.integers(
            0, self.window_ms, size=chaff_rows.size, dtype=np.int64
        )
        all_times = np.concatenate([times, chaff_times])
        starts = (all_times // self.window_ms) * self.window_ms
        infos = self._infos(starts, batch.channel, batch.recipe_id, batch.crowd_id)
        n = len(payloads)
        sealed: list[bytes] = [b""] * n
        to_seal = [row for row in range(n) if payloads[row]]
        for row, message in zip(
            to_seal,
            self.sealer.seal_many(
                [payloads[r] for r in to_seal], [infos[r] for r in to_seal], self.pad_to
            ),
            strict=True,
        ):
            sealed[row] = message
        sealed += self.sealer.chaff(infos[n:], self.pad_to)
        Metrics.counter("esa.simulate", "chaff_messages").inc(int(chaff_rows.size))
        order = self.rng.permutation(len(sealed))
        sealed = [sealed[i] for i in order.tolist()]
        encoded = EncodedPayloads.from_list(sealed)
        return dataclasses.replace(
            batch,
            origin=np.concatenate([origin, origin[chaff_rows]])[order],
            event_time_ms=all_times[order],
            payloads=encoded,
            payload_crc32c=crc32c_many(encoded),
        )

    def _infos(
        self, starts: np.ndarray, channel: str, recipe_id: str, crowd_id: str | None
    ) -> list[bytes]:
        unique, inverse = np.unique(starts, return_inverse=True)
        by_window = [
            self.sealer.info(recipe_id, channel, int(s), int(s) + self.window_ms, crowd_id)
            for s in unique.tolist()
        ]
        return [by_window[i] for i in inverse.tolist()]


def sealing_for(
    recipe: Recipe, public_key_json: str | None, window_ms: int
) -> DeviceSealing | None:
    """The device-side sealing of a simulation plan (None: payloads stay plaintext)."""
    if public_key_json is None:
        return None
    public = PublicKeyInfo.from_json(public_key_json, "simulation plan public key")
    return DeviceSealing(recipe, public, window_ms)


def sealing_metadata(recipe: Recipe, device: DeviceSealing | None) -> dict[str, Any] | None:
    """What simulation.json states about sealing: suite, key id, lengths and the chaff sent
    (rate per device, crowd and instance; the count is the ``chaff_messages`` counter)."""
    if device is None:
        return None
    return {
        "suite": SUITE_NAME,
        "key_id": device.sealer.public.key_id,
        "padded_length": device.pad_to,
        "sealed_length": sealing.sealed_length(device.pad_to),
        "chaff_rate": device.chaff_rate,
        "chaff_allowance": chaff_allowance(recipe),
    }


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
    look sealed (``schemas.sealing.looks_sealed``), as ``sealed_without_key_ring``.
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

    def open_batch(self, batch: pa.RecordBatch) -> OpenedBatch:
        rows = batch.num_rows
        payload_column = batch.column("payload")
        stored = batch.column("payload_crc32c").fill_null(-1).to_numpy(zero_copy_only=False)
        encoded = EncodedPayloads.from_arrow(payload_column)
        actual = crc32c_many(encoded).astype(np.int64)
        lengths = encoded.lengths
        # Rows left to the decoder as they are: empty payloads, CRC mismatches, unknown recipes.
        candidate = (lengths > 0) & (actual == stored)
        status = np.zeros(rows, dtype=np.uint8)
        if self.ring is None:
            first = np.zeros(rows, dtype=np.uint8)
            first[lengths > 0] = encoded.data[encoded.offsets[:-1][lengths > 0]]
            status[candidate & sealing.looks_sealed(first, lengths)] = sealing.NO_KEY_RING
            return _finish(batch, status, None, candidate, stored)
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
