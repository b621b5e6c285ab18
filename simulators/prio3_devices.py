"""Devices of a prio3 recipe: randomize as always, then shard and seal the whole report (pure).

samplable-anonymous-aggregation §3.1.2 and §4.4.1, in DAP's form: per reporting device and window,
the fleet's randomized messages (one per set bit of the randomized one-hot vector, Algorithm 1 of
esa-privacy-revisited; the local guarantee is unchanged) are gathered back into the device's bit
vector, which is sharded by Prio3 (``schemas.crypto.vdaf``: two additive shares and a validity
proof, the crate's CSPRNG) and each input share sealed to its aggregator
(``schemas.crypto.prio3_reports``, bound to the report id, window and crowd). The device sends
that one payload as one Report to one shuffler instance (drawn from the recipe's instance
weights), and its presence messages to every instance as always, so the shuffler still counts
respondents, caps origins and applies its threshold, while reading neither share.

Report ids are 16 bytes from the operating system's CSPRNG: unique per report (the aggregators
refuse a second report with the same id in a batch) and the VDAF nonce.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from schemas.avro.crc32c import crc32c_many
from schemas.crypto.analyzer_keys import PublicKeyInfo
from schemas.crypto.prio3_reports import REPORT_ID_BYTES, layout_of, seal_reports
from schemas.crypto.vdaf import SHARES, VDAF_DRAFT, Prio3
from schemas.payloads import EncodedPayloads
from schemas.recipes import Recipe
from simulators.fleet import DeviceFleet, FleetBatch, format_origins
from simulators.reports import ReportBatch

__all__ = ["Prio3Devices", "prio3_devices_for", "prio3_metadata", "report_vectors"]


def report_vectors(batch: FleetBatch, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each reporting device's randomized bit vector per window.

    Reports are the presence messages of instance 0 (one per reporting device and window, whatever
    its data); a data message belongs to the report of its origin and window. Returns the reports'
    origins and windows and an ``(reports, length)`` uint8 matrix of their bits.
    """
    first = batch.presence_instance == 0
    origins = batch.presence_origin[first]
    windows = batch.presence_window[first]
    bits = np.zeros((origins.size, length), dtype=np.uint8)
    if batch.num_messages:
        # One int64 key per (origin, window): the origin's rank among all origins, then the window.
        unique, inverse = np.unique(
            np.concatenate([origins, batch.message_origin]), return_inverse=True
        )
        span = int(max(windows.max(initial=0), batch.message_window.max(initial=0))) + 1
        keys = inverse.astype(np.int64) * span + np.concatenate([windows, batch.message_window])
        report_keys, message_keys = keys[: origins.size], keys[origins.size :]
        order = np.argsort(report_keys)
        found = np.searchsorted(report_keys, message_keys, sorter=order)
        rows = order[np.minimum(found, origins.size - 1)]
        if origins.size == 0 or (report_keys[rows] != message_keys).any():
            raise ValueError("a data message has no presence message of its device and window")
        bits[rows, batch.messages.bucket.astype(np.int64)] = 1
    return origins, windows, bits


@dataclass
class Prio3Devices:
    """Shards and seals the reports of a fleet batch for the two aggregators."""

    recipe: Recipe
    aggregator_keys: tuple[PublicKeyInfo, ...]
    window_ms: int

    def __post_init__(self) -> None:
        if len(self.aggregator_keys) != SHARES:
            raise ValueError(f"{SHARES} aggregator public keys are needed")
        self.vdaf: Prio3 = self.recipe.build_vdaf()
        self.payload_length = layout_of(self.vdaf).payload

    def report_batches(
        self, batch: FleetBatch, fleet: DeviceFleet, rng: np.random.Generator
    ) -> list[ReportBatch]:
        """One ReportBatch per shuffler instance: its prio3 reports, then its presence messages."""
        origins, windows, bits = report_vectors(batch, self.vdaf.length)
        count = origins.size
        ids = secrets.token_bytes(REPORT_ID_BYTES * count)
        payloads = seal_reports(
            self.vdaf,
            self.aggregator_keys,
            list(bits),
            [ids[i : i + REPORT_ID_BYTES] for i in range(0, len(ids), REPORT_ID_BYTES)],
            self.recipe.id,
            self.recipe.channel,
            fleet.window_start_ms(windows).tolist(),
            self.window_ms,
            None,
        )
        # Like any data message: an instance from the recipe's weights, a time in its window.
        instance = fleet._instances(count, rng)
        event_ms = fleet._event_times(windows, rng)
        out = []
        for u in range(fleet.num_instances):
            rows = np.flatnonzero(instance == u)
            presence = np.flatnonzero(batch.presence_instance == u)
            encoded = EncodedPayloads.from_list(
                [payloads[i] for i in rows.tolist()] + [b""] * presence.size
            )
            out.append(
                ReportBatch(
                    shuffler_instance=u,
                    channel=self.recipe.channel,
                    recipe_id=self.recipe.id,
                    min_crowd_size=int(self.recipe.min_crowd_size),
                    origin=format_origins(
                        np.concatenate([origins[rows], batch.presence_origin[presence]])
                    ),
                    event_time_ms=np.concatenate(
                        [event_ms[rows], batch.presence_event_ms[presence]]
                    ),
                    payloads=encoded,
                    payload_crc32c=crc32c_many(encoded),
                )
            )
        return out


def prio3_devices_for(
    recipe: Recipe, aggregator_keys_json: Sequence[str] | None, window_ms: int
) -> Prio3Devices | None:
    """The devices' prio3 side of a simulation plan (None for a recipe in the shuffled model)."""
    if not recipe.is_prio3:
        return None
    if aggregator_keys_json is None or len(aggregator_keys_json) != SHARES:
        raise ValueError(
            f"recipe {recipe.id} is a prio3 recipe: devices need the {SHARES} aggregators' public "
            "keys (esa simulate --aggregator-keys)"
        )
    keys = tuple(
        PublicKeyInfo.from_json(text, f"aggregator {j} public key")
        for j, text in enumerate(aggregator_keys_json)
    )
    return Prio3Devices(recipe, keys, window_ms)


def prio3_metadata(devices: Prio3Devices | None) -> dict[str, object] | None:
    """What simulation.json states about a prio3 simulation: VDAF, draft, lengths, key ids."""
    if devices is None:
        return None
    vdaf = devices.vdaf
    return {
        "vdaf": {"histogram": "Prio3Histogram", "multihot": "Prio3MultihotCountVec"}.get(
            vdaf.kind, "Prio3SumVec"
        ),
        "draft": VDAF_DRAFT,
        "length": vdaf.length,
        "max_weight": vdaf.max_weight,
        "payload_length": devices.payload_length,
        "aggregator_key_ids": [key.key_id for key in devices.aggregator_keys],
    }
