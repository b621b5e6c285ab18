"""Sealed payloads: what a device sends so that only the analyzer can read it.

esa-privacy-revisited, Section II (attack model): shufflers "learn nothing about the content of
reports unless [they collude] with the analyzer", "due to encryption". Every non-empty payload is
sealed on the device for the analyzer with RFC 9180 HPKE in base mode, suite
DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / AES-128-GCM, from the ``cryptography`` library
(single-shot ``Suite.encrypt``: one fresh encapsulation, i.e. a fresh ephemeral key, per message).
Nothing here implements a primitive.

Envelope (the payload bytes; no Avro schema change)::

    version (1 byte, 0x01) | key id (8 bytes) | enc (32 bytes) | AES-128-GCM ciphertext + tag

The key id is a fixed-size header inside the payload, so the shuffler can forward and the analyzer
can pick its key without any other field. The HPKE ``info`` (RFC 9180 §8.1: the single-shot APIs
authenticate auxiliary data through ``info``) binds the message to its envelope header, recipe id,
channel, event-time window and crowd id: a shuffler that moves a message to another crowd, window
or recipe makes it fail to open.

The plaintext is padded to ONE length per recipe (:func:`padded_length`, from the recipe's largest
payload): one length byte, the payload, zero bytes. So ciphertext length tells no payload kind,
bucket or varint width from another. A length byte of 255 marks chaff (cover traffic,
Section II: messages "discarded by the analyzer"); chaff is sealed like any message, so nobody
without the analyzer's key can tell it from data (IND-CCA2 of HPKE), and the analyzer counts it
as chaff instead of as an error. Empty payloads (presence messages) are never sealed.

Opening (:func:`open_sealed`) never raises on bad input: each message gets a status from
:data:`OPEN_REASONS` (a flipped byte, a wrong or retired key, a truncated message, a bad pad).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from schemas.crypto.analyzer_keys import KEY_ID_BYTES, KeyRing, PublicKeyInfo
from schemas.payloads import payload_limits

if TYPE_CHECKING:
    from schemas.recipes import Recipe

__all__ = [
    "SUITE",
    "ENVELOPE_VERSION",
    "HEADER_BYTES",
    "ENC_BYTES",
    "TAG_BYTES",
    "OVERHEAD",
    "CHAFF_MARK",
    "OK",
    "CHAFF",
    "OPEN_REASONS",
    "padded_length",
    "sealed_length",
    "pad",
    "context_info",
    "Sealer",
    "OpenedPayloads",
    "open_sealed",
    "looks_sealed",
]

SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_128_GCM)
ENVELOPE_VERSION = 1
HEADER_BYTES = 1 + KEY_ID_BYTES
ENC_BYTES = 32  # Nenc of DHKEM(X25519, HKDF-SHA256), RFC 9180 Table 2
TAG_BYTES = 16  # Nt of AES-128-GCM, RFC 9180 Table 5
OVERHEAD = HEADER_BYTES + ENC_BYTES + TAG_BYTES
CHAFF_MARK = 0xFF  # length byte of a chaff plaintext
MAX_PAYLOAD = CHAFF_MARK - 1
INFO_LABEL = b"esa-sealed-report/1"

# Status of each opened message: 0 opened, 1 chaff, others are dead-letter reasons.
OPEN_REASONS: tuple[str, ...] = (
    "ok",
    "chaff",
    "sealed_bad_length",  # truncated or extended: not the recipe's sealed length
    "sealed_bad_version",  # unknown envelope version byte
    "sealed_unknown_key",  # the key id names no key in the analyzer's ring
    "sealed_retired_key",  # the key's validity does not cover the message's window
    "sealed_open_failed",  # authentication failed: flipped byte, wrong key, moved to another crowd
    "sealed_bad_padding",  # opened, but the padding is not the canonical one
    "sealed_without_key_ring",  # a sealed payload reached an analyzer given no key ring
)
OK, CHAFF, BAD_LENGTH, BAD_VERSION, UNKNOWN_KEY, RETIRED_KEY, OPEN_FAILED, BAD_PADDING = range(8)
NO_KEY_RING = 8


def padded_length(payload_kind: str, limits: dict[str, int]) -> int:
    """Plaintext length after padding for a recipe: 1 length byte + its largest payload.

    The largest payload is the Avro encoding of the kind with every field at its largest value
    (``limits``: exclusive upper bounds, ``schemas.payloads.payload_limits``); sign fields encode
    as one byte. Census payloads (one tag byte) are never longer.
    """
    from schemas.payloads import LAYOUTS, encode_payloads

    layout = LAYOUTS[payload_kind]
    fields = {
        name: np.array([-1 if name == "sign" else max(int(limits.get(name, 1)) - 1, 0)])
        for name in layout.field_names
    }
    largest = int(encode_payloads(payload_kind, fields).lengths[0])
    if largest > MAX_PAYLOAD:
        raise ValueError(f"{payload_kind} payloads of {largest} bytes are too long to seal")
    return 1 + largest


def sealed_length(pad_to: int) -> int:
    """Bytes of every sealed message of a recipe whose plaintexts pad to ``pad_to``."""
    return OVERHEAD + pad_to


def pad(payload: bytes, pad_to: int) -> bytes:
    """Length byte, payload, zeros up to ``pad_to`` bytes."""
    if len(payload) > min(pad_to - 1, MAX_PAYLOAD):
        raise ValueError(f"payload of {len(payload)} bytes does not fit a pad of {pad_to}")
    return bytes([len(payload)]) + payload + bytes(pad_to - 1 - len(payload))


def _chaff_plaintext(pad_to: int) -> bytes:
    return bytes([CHAFF_MARK]) + bytes(pad_to - 1)


def _text(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode("utf-8")
    return b"\x01" + struct.pack(">I", len(data)) + data


def context_info(
    header: bytes,
    recipe_id: str,
    channel: str,
    window_start_ms: int,
    window_end_ms: int,
    crowd_id: str | None,
) -> bytes:
    """HPKE ``info``: a label, the envelope header and the message's crowd coordinates, each
    field length-prefixed so that no two contexts encode alike."""
    return b"".join(
        [
            INFO_LABEL,
            header,
            _text(recipe_id),
            _text(channel),
            struct.pack(">qq", int(window_start_ms), int(window_end_ms)),
            _text(crowd_id),
        ]
    )


def _header(key_id: bytes) -> bytes:
    return bytes([ENVELOPE_VERSION]) + key_id


class Sealer:
    """Seals payloads for one analyzer public key (what a device holds)."""

    def __init__(self, public: PublicKeyInfo) -> None:
        self.public = public
        self.header = _header(public.key_id_bytes)
        self._key = public.public_key()

    def info(
        self,
        recipe_id: str,
        channel: str,
        window_start_ms: int,
        window_end_ms: int,
        crowd_id: str | None,
    ) -> bytes:
        return context_info(
            self.header, recipe_id, channel, window_start_ms, window_end_ms, crowd_id
        )

    def seal(self, padded: bytes, info: bytes) -> bytes:
        """One sealed message: header + HPKE single-shot (fresh ephemeral key) of ``padded``."""
        return self.header + SUITE.encrypt(padded, self._key, info)

    def seal_many(
        self, payloads: Sequence[bytes], infos: Sequence[bytes], pad_to: int
    ) -> list[bytes]:
        """Pad and seal each payload under its own info."""
        encrypt, key, header = SUITE.encrypt, self._key, self.header
        return [
            header + encrypt(pad(payload, pad_to), key, info)
            for payload, info in zip(payloads, infos, strict=True)
        ]

    def chaff(self, infos: Sequence[bytes], pad_to: int) -> list[bytes]:
        """Cover messages: sealed chaff plaintexts, the same length as every sealed message."""
        plaintext = _chaff_plaintext(pad_to)
        return [self.header + SUITE.encrypt(plaintext, self._key, info) for info in infos]


def looks_sealed(first_bytes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Which payloads start like an envelope, from their first bytes and lengths (vectorized).

    Unambiguous for canonical plaintexts: a payload starts with its Avro kind tag, a zigzag
    varint of a non-negative int, whose first byte is even; the envelope version byte is odd.
    """
    return (lengths > OVERHEAD) & (first_bytes == ENVELOPE_VERSION)


@dataclass(frozen=True)
class OpenedPayloads:
    """Unpadded payloads (``b""`` where not opened) and a status per message (``OPEN_REASONS``)."""

    payloads: list[bytes]
    status: np.ndarray

    def reason_names(self) -> np.ndarray:
        return np.asarray(OPEN_REASONS, dtype=object)[self.status]


def open_sealed(
    ring: KeyRing,
    sealed: Sequence[bytes],
    pad_to: int,
    recipe_id: str,
    channel: str,
    window_start_ms: int,
    window_end_ms: int,
    crowd_id: str | None,
) -> OpenedPayloads:
    """Open messages of one crowd (one recipe, channel, window, crowd id); never raises."""
    expected = sealed_length(pad_to)
    status = np.zeros(len(sealed), dtype=np.uint8)
    out: list[bytes] = [b""] * len(sealed)
    infos: dict[bytes, bytes] = {}
    decrypt = SUITE.decrypt
    for row, message in enumerate(sealed):
        if len(message) != expected:
            status[row] = BAD_LENGTH
            continue
        if message[0] != ENVELOPE_VERSION:
            status[row] = BAD_VERSION
            continue
        header = message[:HEADER_BYTES]
        key = ring.get(header[1:])
        if key is None:
            status[row] = UNKNOWN_KEY
            continue
        if not key.public.valid_for(window_start_ms, window_end_ms):
            status[row] = RETIRED_KEY
            continue
        info = infos.get(header)
        if info is None:
            info = infos[header] = context_info(
                header, recipe_id, channel, window_start_ms, window_end_ms, crowd_id
            )
        try:
            padded = decrypt(message[HEADER_BYTES:], key.private_key, info)
        except (InvalidTag, ValueError):
            status[row] = OPEN_FAILED
            continue
        length = padded[0]
        if length == CHAFF_MARK:
            status[row] = CHAFF if padded == _chaff_plaintext(pad_to) else BAD_PADDING
        elif length >= pad_to or any(padded[1 + length :]):
            status[row] = BAD_PADDING
        else:
            out[row] = padded[1 : 1 + length]
    return OpenedPayloads(out, status)


def recipe_pad_length(recipe: Recipe) -> int:
    """The one plaintext length every sealed message of ``recipe`` is padded to."""
    return padded_length(recipe.payload_kind, payload_limits(recipe.build_randomizer()))
