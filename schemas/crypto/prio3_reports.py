"""Prio3 reports on the wire: input shares sealed one to each aggregator, aggregate shares sealed
to the analyzer (samplable-anonymous-aggregation §3.1.2, §4.4.1; DAP's report layout).

A device's report is one Report payload, forwarded byte for byte by the shuffler, which can open
neither share::

    version (1 byte, 0x03) | report id (16 bytes, the VDAF nonce) | public share
      | sealed input share for aggregator 0 | sealed input share for aggregator 1

Every part has one length per VDAF (:class:`ShareLayout`), so a payload's length says nothing
about its measurement. A sealed share is the envelope of ``schemas.crypto.sealing`` (version, key id,
HPKE ``enc``, AES-128-GCM ciphertext; RFC 9180 single-shot, a fresh encapsulation per share)
under the aggregator's own ``esa-key/1`` key, its ``info`` binding the share to its aggregator,
its report id and the report's recipe, channel, window and crowd: a share moved to another
report, crowd or window, or sent to the other aggregator, fails to open.

An aggregator's published aggregate share is sealed the same way to the analyzer, its ``info``
binding aggregator, run, recipe, channel, window, crowd, report count and report-id checksum
(:func:`aggregate_info`): the analyzer can open only the share that states what both
aggregators agreed on.

The version byte 0x03 is odd (no plaintext payload starts with an odd byte) and not the sealed
envelope's 0x01, so no prio3 payload is mistaken for either.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag

from schemas.crypto.analyzer_keys import KeyRing, PublicKeyInfo
from schemas.crypto.sealing import ENC_BYTES, HEADER_BYTES, SUITE, TAG_BYTES, Sealer, context_info
from schemas.crypto.vdaf import NONCE_SIZE, SHARES, Prio3, Shards

__all__ = [
    "PAYLOAD_VERSION",
    "REPORT_ID_BYTES",
    "SHARE_REASONS",
    "ShareLayout",
    "ParsedReports",
    "layout_of",
    "share_info",
    "aggregate_info",
    "seal_shards",
    "seal_reports",
    "parse_reports",
    "open_shares",
    "report_id_checksum",
    "add_checksums",
    "seal_aggregate_share",
    "open_aggregate_share",
]

PAYLOAD_VERSION = 0x03
REPORT_ID_BYTES = NONCE_SIZE
SEAL_OVERHEAD = HEADER_BYTES + ENC_BYTES + TAG_BYTES
INPUT_SHARE_LABEL = b"esa-prio3-input-share/1"
AGGREGATE_SHARE_LABEL = b"esa-prio3-aggregate-share/1"
CHECKSUM_MODULUS = 2**256

# Why an aggregator could not use a report's share (dead-letter reasons); 0 is success.
SHARE_REASONS: tuple[str, ...] = (
    "ok",
    "prio3_bad_length",  # not the recipe's one payload length (truncated, extended, presence)
    "prio3_bad_version",  # not a prio3 payload
    "prio3_unknown_key",  # the share is sealed to a key this aggregator does not hold
    "prio3_retired_key",  # the key's validity does not cover the report's window
    "prio3_open_failed",  # authentication failed: flipped byte, moved report, other aggregator
)
OK, BAD_LENGTH, BAD_VERSION, UNKNOWN_KEY, RETIRED_KEY, OPEN_FAILED = range(6)


@dataclass(frozen=True)
class ShareLayout:
    """Byte lengths of a VDAF's public share and input shares, and of the whole payload."""

    public_share: int
    input_shares: tuple[int, ...]

    @property
    def sealed_shares(self) -> tuple[int, ...]:
        return tuple(length + SEAL_OVERHEAD for length in self.input_shares)

    @property
    def payload(self) -> int:
        return 1 + REPORT_ID_BYTES + self.public_share + sum(self.sealed_shares)

    def offsets(self) -> list[int]:
        """Start of the public share and of each sealed share, then the end."""
        starts = [1 + REPORT_ID_BYTES, 1 + REPORT_ID_BYTES + self.public_share]
        for length in self.sealed_shares:
            starts.append(starts[-1] + length)
        return starts


def layout_of(vdaf: Prio3) -> ShareLayout:
    """The one layout of every report of ``vdaf`` (measured on the shards of a valid report)."""
    zero = 0 if vdaf.kind == "histogram" else np.zeros(vdaf.length, dtype=np.int64)
    shards = vdaf.shard(zero, bytes(NONCE_SIZE), bytes(vdaf.rand_size))
    return ShareLayout(len(shards.public_share), tuple(len(s) for s in shards.input_shares))


def share_info(
    header: bytes,
    agg_id: int,
    report_id: bytes,
    recipe_id: str,
    channel: str,
    window_start_ms: int,
    window_end_ms: int,
    crowd_id: str | None,
) -> bytes:
    """HPKE ``info`` of aggregator ``agg_id``'s input share of one report."""
    return b"".join(
        [
            INPUT_SHARE_LABEL,
            bytes([agg_id]),
            report_id,
            context_info(header, recipe_id, channel, window_start_ms, window_end_ms, crowd_id),
        ]
    )


def seal_shards(
    shards: Shards,
    sealers: Sequence[Sealer],
    report_id: bytes,
    recipe_id: str,
    channel: str,
    window_start_ms: int,
    window_end_ms: int,
    crowd_id: str | None,
) -> bytes:
    """One report's payload from its shards: each input share sealed to its aggregator."""
    if len(report_id) != REPORT_ID_BYTES:
        raise ValueError(f"a report id is {REPORT_ID_BYTES} bytes, got {len(report_id)}")
    parts = [bytes([PAYLOAD_VERSION]), report_id, shards.public_share]
    for agg_id, (sealer, share) in enumerate(zip(sealers, shards.input_shares, strict=True)):
        info = share_info(
            sealer.header,
            agg_id,
            report_id,
            recipe_id,
            channel,
            int(window_start_ms),
            int(window_end_ms),
            crowd_id,
        )
        parts.append(sealer.seal(share, info))
    return b"".join(parts)


def seal_reports(
    vdaf: Prio3,
    aggregator_keys: Sequence[PublicKeyInfo],
    measurements: Sequence[object],
    report_ids: Sequence[bytes],
    recipe_id: str,
    channel: str,
    window_starts_ms: Sequence[int],
    window_ms: int,
    crowd_id: str | None,
) -> list[bytes]:
    """One payload per measurement: shard (the crate's CSPRNG), seal each input share to its
    aggregator. ``report_ids``: REPORT_ID_BYTES random bytes each, unique per report."""
    if len(aggregator_keys) != SHARES:
        raise ValueError(f"{SHARES} aggregator keys are needed, got {len(aggregator_keys)}")
    sealers = [Sealer(key) for key in aggregator_keys]
    return [
        seal_shards(
            vdaf.shard(measurement, report_id),
            sealers,
            report_id,
            recipe_id,
            channel,
            int(start),
            int(start) + int(window_ms),
            crowd_id,
        )
        for measurement, report_id, start in zip(
            measurements, report_ids, window_starts_ms, strict=True
        )
    ]


@dataclass(frozen=True)
class ParsedReports:
    """Report ids, public shares and aggregator ``agg_id``'s sealed shares of a batch of
    payloads; ``status`` per payload (:data:`SHARE_REASONS`), parts empty where not OK."""

    report_ids: list[bytes]
    public_shares: list[bytes]
    sealed_shares: list[bytes]
    status: np.ndarray


def parse_reports(payloads: Sequence[bytes], layout: ShareLayout, agg_id: int) -> ParsedReports:
    """Splits payloads into their parts; never raises on bad input."""
    offsets = layout.offsets()
    status = np.zeros(len(payloads), dtype=np.uint8)
    ids, publics, sealed = [b""] * len(payloads), [b""] * len(payloads), [b""] * len(payloads)
    for row, payload in enumerate(payloads):
        if len(payload) != layout.payload:
            status[row] = BAD_LENGTH
            continue
        if payload[0] != PAYLOAD_VERSION:
            status[row] = BAD_VERSION
            continue
        ids[row] = payload[1 : 1 + REPORT_ID_BYTES]
        publics[row] = payload[offsets[0] : offsets[1]]
        sealed[row] = payload[offsets[1 + agg_id] : offsets[2 + agg_id]]
    return ParsedReports(ids, publics, sealed, status)


def open_shares(
    ring: KeyRing,
    agg_id: int,
    parsed: ParsedReports,
    recipe_id: str,
    channel: str,
    window_start_ms: int,
    window_end_ms: int,
    crowd_id: str | None,
) -> tuple[list[bytes], np.ndarray]:
    """Aggregator ``agg_id`` opens its sealed shares of one crowd; (input shares, status)."""
    status = parsed.status.copy()
    shares = [b""] * len(status)
    decrypt = SUITE.decrypt
    for row in np.flatnonzero(status == OK).tolist():
        message = parsed.sealed_shares[row]
        key = ring.get(message[1:HEADER_BYTES])
        if key is None:
            status[row] = UNKNOWN_KEY
            continue
        if not key.public.valid_for(window_start_ms, window_end_ms):
            status[row] = RETIRED_KEY
            continue
        info = share_info(
            message[:HEADER_BYTES],
            agg_id,
            parsed.report_ids[row],
            recipe_id,
            channel,
            window_start_ms,
            window_end_ms,
            crowd_id,
        )
        try:
            shares[row] = decrypt(message[HEADER_BYTES:], key.private_key, info)
        except (InvalidTag, ValueError):
            status[row] = OPEN_FAILED
    return shares, status


# -- which reports were aggregated ------------------------------------------------------------


def report_id_checksum(report_ids: Sequence[bytes]) -> int:
    """Σ SHA-256(report id) mod 2^256: order-free, mergeable by addition (:func:`add_checksums`);
    two aggregators that summed the same reports state the same number."""
    total = 0
    for report_id in report_ids:
        total += int.from_bytes(hashlib.sha256(report_id).digest(), "big")
    return total % CHECKSUM_MODULUS


def add_checksums(*checksums: int) -> int:
    return sum(checksums) % CHECKSUM_MODULUS


# -- aggregate shares for the analyzer --------------------------------------------------------


def aggregate_info(
    header: bytes,
    agg_id: int,
    run_id: str,
    recipe_id: str,
    channel: str,
    window_start_ms: int,
    window_end_ms: int,
    crowd_id: str | None,
    reports: int,
    checksum: int,
) -> bytes:
    """HPKE ``info`` of an aggregate share: everything the analyzer checks it against."""
    run = run_id.encode("utf-8")
    return b"".join(
        [
            AGGREGATE_SHARE_LABEL,
            bytes([agg_id]),
            struct.pack(">I", len(run)),
            run,
            struct.pack(">q", int(reports)),
            int(checksum).to_bytes(32, "big"),
            context_info(header, recipe_id, channel, window_start_ms, window_end_ms, crowd_id),
        ]
    )


def seal_aggregate_share(
    analyzer_key: PublicKeyInfo, share: bytes, agg_id: int, run_id: str, **coordinates: object
) -> bytes:
    """An aggregate share sealed to the analyzer (``coordinates``: :func:`aggregate_info`'s
    recipe_id, channel, window_start_ms, window_end_ms, crowd_id, reports, checksum)."""
    sealer = Sealer(analyzer_key)
    return sealer.seal(share, aggregate_info(sealer.header, agg_id, run_id, **coordinates))


def open_aggregate_share(
    ring: KeyRing, sealed: bytes, agg_id: int, run_id: str, **coordinates: object
) -> bytes | None:
    """The analyzer opens an aggregate share; None when it does not open under exactly these
    coordinates (another aggregator, run, window, crowd, count or checksum, or a flipped byte)."""
    if len(sealed) <= SEAL_OVERHEAD:
        return None
    key = ring.get(sealed[1:HEADER_BYTES])
    if key is None:
        return None
    info = aggregate_info(sealed[:HEADER_BYTES], agg_id, run_id, **coordinates)
    try:
        return SUITE.decrypt(sealed[HEADER_BYTES:], key.private_key, info)
    except (InvalidTag, ValueError):
        return None
