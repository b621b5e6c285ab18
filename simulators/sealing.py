"""Sealing on the device, on whole batches (``schemas.crypto.sealing``; pure: no Beam).

Device side, :class:`DeviceSealing` turns a ``ReportBatch`` of plaintext payloads into one with
sealed payloads: every non-empty payload padded to the recipe's one length and sealed to the
analyzer's public key, bound to recipe, channel, window and crowd id; empty payloads (presence)
left alone; chaff added at the recipe's ``chaff_rate``, anchored on the presence messages (one
per device, recipe window and instance, whatever the device's data): per presence message
``floor(rate)`` cover messages plus one more with probability ``rate - floor(rate)``, at most
``Recipe.chaff_allowance``, which the shuffler's per-origin cap adds
(``transforms/shuffler/decide.py``), each with its own event time drawn uniformly in the window
like a data message's and the recipe's one sealed length; rows permuted so that
position in the batch says nothing about which rows are chaff. CRC32C is recomputed over the
sealed bytes (what the shuffler checks and forwards).

The chaff a batch got is what it holds beyond the fleet's data and presence messages
(``simulators.plan.ShardSummary.add_chaff``); the Beam shell counts it. The analyzer side
(opening) is ``transforms.analyzer.opening``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from privacy.rng import secure_generator
from schemas.avro.crc32c import crc32c_many
from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import SUITE_NAME, PublicKeyInfo
from schemas.payloads import EncodedPayloads
from schemas.recipes import Recipe

__all__ = [
    "chaff_rate",
    "chaff_allowance",
    "DeviceSealing",
    "sealing_for",
    "sealing_metadata",
]


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
        self.pad_to = sealing.recipe_pad_length(recipe)
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
    (rate per device, crowd and instance; the count is ``ShardSummary.chaff``, summed as the
    ``chaff_messages`` counter by ``transforms.devices.encode``)."""
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
