"""LDP-SGD messages: the payload bytes of one report and the channel of one epoch.

Payload (18 bytes, fixed, so every report of a crowd has the same length): one format tag
(``0xE5``), the 16-byte PRG seed, one sign byte (``0x01`` for +1, ``0xFF`` for -1). Section VI
of esa-privacy-revisited: "communication can be reduced to 129 bits by sending (sgn, s)".

Each epoch is its own shuffler run on its own channel (Section VI: "each epoch is executed on a
separate shuffler"); the recipe id names the dataset, epoch and every randomizer parameter, so
reports of different epochs or settings never share a crowd.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from schemas.avro.columns import binary_buffers

__all__ = [
    "PAYLOAD_TAG",
    "PAYLOAD_BYTES",
    "SgdChannel",
    "DecodedReports",
    "encode_sgd_payloads",
    "decode_sgd_payloads",
]

PAYLOAD_TAG = 0xE5
SEED_BYTES = 16
PAYLOAD_BYTES = 2 + SEED_BYTES
BAD_LENGTH = "bad_payload_length"
BAD_TAG = "bad_payload_tag"
BAD_SIGN = "bad_payload_sign"


def _format_number(value: float) -> str:
    return f"{value:g}".replace("+", "")


@dataclass(frozen=True)
class SgdChannel:
    """Channel and recipe id of one LDP-SGD epoch."""

    dataset: str
    epoch: int
    epsilon: float
    clip_norm: float
    dimension: int
    instances: int = 1
    reports_per_device: int = 1
    min_crowd_size: int = 1

    @property
    def channel(self) -> str:
        slug = self.dataset.replace(":", "-")
        return f"ldp_sgd.{slug}.epoch{self.epoch:04d}"

    @property
    def recipe_id(self) -> str:
        slug = self.dataset.replace(":", "-")
        return (
            f"ldp-sgd-{slug}-e{self.epoch:04d}-eps{_format_number(self.epsilon)}"
            f"-l{_format_number(self.clip_norm)}-d{self.dimension}-k{self.instances}"
            f"-tau{self.reports_per_device}@1"
        )

    @property
    def origin_caps(self) -> tuple[int, ...]:
        """Per shuffler instance, the most data messages one origin may send to this epoch's
        crowd: an honest device sends exactly tau reports, all to one instance, so the cap is
        tau everywhere (no tail to allow for; ``transforms.shuffler.decide`` screens the rest as
        ``over_origin_cap``)."""
        return (self.reports_per_device,) * self.instances


def encode_sgd_payloads(seeds: np.ndarray, signs: np.ndarray) -> pa.BinaryArray:
    """One 18-byte payload per report, as an Arrow binary array (no per-report Python)."""
    rows = np.asarray(seeds, dtype=np.uint8)
    count = rows.shape[0]
    if rows.shape != (count, SEED_BYTES) or np.shape(signs) != (count,):
        raise ValueError(f"seeds must be (n, {SEED_BYTES}) and signs (n,), got {rows.shape}")
    block = np.empty((count, PAYLOAD_BYTES), dtype=np.uint8)
    block[:, 0] = PAYLOAD_TAG
    block[:, 1 : 1 + SEED_BYTES] = rows
    block[:, -1] = np.where(np.asarray(signs) > 0, 0x01, 0xFF)
    offsets = np.arange(count + 1, dtype=np.int32) * PAYLOAD_BYTES
    return pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(block.tobytes())]
    )


@dataclass(frozen=True)
class DecodedReports:
    """Valid reports (seed rows, signs) and, per rejected row, its index and reason."""

    seeds: np.ndarray
    signs: np.ndarray
    rejected_rows: np.ndarray
    rejected_reasons: tuple[str, ...]


def decode_sgd_payloads(payloads: pa.Array) -> DecodedReports:
    """Split a binary column into valid (seed, sign) reports and rejected rows with reasons."""
    array = (
        payloads.cast(pa.large_binary())
        if not pa.types.is_large_binary(payloads.type)
        else payloads
    )
    array = array.fill_null(b"")
    offsets, data = binary_buffers(array)
    lengths = np.diff(offsets)
    reasons = np.full(len(array), "", dtype=object)
    good = lengths == PAYLOAD_BYTES
    reasons[~good] = BAD_LENGTH
    starts = offsets[:-1][good]
    index = starts[:, None] + np.arange(PAYLOAD_BYTES)
    block = data[index] if starts.size else np.zeros((0, PAYLOAD_BYTES), dtype=np.uint8)
    rows = np.flatnonzero(good)
    tag_ok = block[:, 0] == PAYLOAD_TAG
    sign_ok = (block[:, -1] == 0x01) | (block[:, -1] == 0xFF)
    reasons[rows[~tag_ok]] = BAD_TAG
    reasons[rows[tag_ok & ~sign_ok]] = BAD_SIGN
    keep = tag_ok & sign_ok
    rejected = np.flatnonzero(reasons != "")
    return DecodedReports(
        seeds=np.ascontiguousarray(block[keep, 1 : 1 + SEED_BYTES]),
        signs=np.where(block[keep, -1] == 0x01, 1, -1).astype(np.int8),
        rejected_rows=rejected,
        rejected_reasons=tuple(str(reason) for reason in reasons[rejected]),
    )
