"""Signed commit records: each shuffler instance signs its release's ``_COMMIT.json`` (Ed25519).

The analyzer's n per crowd comes only from ``respondents_released`` in the commit records, so a
record edited between the shuffler and the analyzer (n inflated, messages untouched) would make
the printed ε_c false. A shuffler instance therefore signs its record with its own Ed25519 key
(RFC 8032, ``cryptography``; key files in ``schemas/crypto/signing_keys.py``, bound to one instance),
and an analyzer given the shufflers' public keys refuses any record that is unsigned, signed by
an unknown key, by another instance's key or by a key outside its validity, or altered after
signing.

The signature is the record's field ``"signature"``::

    {"algorithm": "Ed25519", "key_id": "<16 hex>", "signed_at_ms": <int>, "value": "<128 hex>"}

Signed bytes: ``CONTEXT`` (``b"esa-release-commit/1\\0"``, so that the key signs nothing else by
accident) followed by the canonical form of the whole record with ``signature.value`` removed
(``algorithm``, ``key_id`` and ``signed_at_ms`` are signed too). Canonical form: JSON with sorted
keys, no whitespace (separators ``,`` and ``:``), non-ASCII characters as UTF-8 (not ``\\u``
escapes), no NaN or infinity, numbers as Python's ``json`` writes them (shortest round-trip
floats); computed from the parsed JSON value, so the pretty-printed file on disk and its
re-parse give the same bytes.

What it protects: every field of the record (files with sizes and SHA-256, so every message
file too; crowds with their counts; instance; parameters) against anyone who can write the
release storage but holds no shuffler key, including swapping in another instance's record or
re-signing with a key the analyzer does not trust. What it does not: a shuffler that lies with
its own key (it is inside its trust domain), replay of an entire older, genuine release of the
same instance, and a stolen key (remove its public file from the analyzer's keys; ``signed_at_ms``
is stated by the signer, so a thief can back-date it into the key's validity).

Pure: the standard library and ``cryptography`` (through ``schemas.crypto.signing_keys``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from schemas.crypto.key_files import MAX_TIME_MS, MIN_TIME_MS, format_time_ms
from schemas.crypto.signing_keys import SIGNING_SUITE, ShufflerKeys, SigningKey, SigningPublicKey

__all__ = [
    "ALGORITHM",
    "CONTEXT",
    "SIGNATURE_FIELD",
    "CLOCK_SKEW_MS",
    "SignatureError",
    "canonical_bytes",
    "signed_message",
    "sign_commit",
    "verify_commit",
]

ALGORITHM = SIGNING_SUITE
CONTEXT = b"esa-release-commit/1\x00"
SIGNATURE_FIELD = "signature"
# A commit may state a signing time this far ahead of the verifier's clock (clocks drift).
CLOCK_SKEW_MS = 5 * 60 * 1000
_FIELDS = ("algorithm", "key_id", "signed_at_ms", "value")
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_VALUE = re.compile(r"[0-9a-f]{128}")


class SignatureError(ValueError):
    """A commit record that may not be trusted (or signed); the message says why, in one line."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def canonical_bytes(value: Any) -> bytes:
    """The canonical JSON bytes of ``value`` (see the module docstring); ValueError if it holds
    NaN, infinity or a string that is not valid Unicode."""
    normal = json.loads(json.dumps(value, allow_nan=False))  # tuples, int keys: as on disk
    text = json.dumps(normal, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def signed_message(record: Mapping[str, Any]) -> bytes:
    """What the signature covers: CONTEXT + the canonical record without ``signature.value``."""
    body = dict(record)
    block = body.get(SIGNATURE_FIELD)
    if isinstance(block, Mapping):
        body[SIGNATURE_FIELD] = {k: v for k, v in block.items() if k != "value"}
    try:
        return CONTEXT + canonical_bytes(body)
    except (ValueError, TypeError, RecursionError) as error:
        raise SignatureError(f"commit record has no canonical JSON form: {error}") from None


def sign_commit(
    record: Mapping[str, Any], key: SigningKey, now_ms: int | None = None
) -> dict[str, Any]:
    """``record`` with its ``signature`` (any old one replaced). SignatureError when the key
    belongs to another instance than the record states or is outside its validity now."""
    now = _now_ms() if now_ms is None else now_ms
    public = key.public
    if record.get("instance") != public.instance:
        raise SignatureError(
            f"signing key {public.key_id} is shuffler instance {public.instance}'s; the commit "
            f"states instance {record.get('instance')!r} (give --instance {public.instance})"
        )
    if not public.valid_at(now):
        raise SignatureError(
            f"signing key {public.key_id} is not valid at {format_time_ms(now)} (valid "
            f"{_validity(public)})"
        )
    body = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    body[SIGNATURE_FIELD] = {"algorithm": ALGORITHM, "key_id": public.key_id, "signed_at_ms": now}
    body[SIGNATURE_FIELD]["value"] = key.sign(signed_message(body)).hex()
    return body


def _validity(key: SigningPublicKey) -> str:
    return f"{format_time_ms(key.valid_from_ms)} .. {format_time_ms(key.valid_until_ms)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _block(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The signature block, checked field by field (never echoing a huge value)."""
    if SIGNATURE_FIELD not in record:
        raise SignatureError("the commit record is not signed (shuffler keys are required)")
    block = record[SIGNATURE_FIELD]
    if not isinstance(block, Mapping) or sorted(block) != sorted(_FIELDS):
        raise SignatureError(
            "the commit record's signature is not an object of exactly " + ", ".join(_FIELDS)
        )
    if block["algorithm"] != ALGORITHM:
        raise SignatureError(f"signature algorithm {_short(block['algorithm'])} is not {ALGORITHM}")
    if not isinstance(block["key_id"], str) or not _KEY_ID.fullmatch(block["key_id"]):
        raise SignatureError(f"signature key_id {_short(block['key_id'])} is not 16 hex digits")
    signed_at = block["signed_at_ms"]
    if (
        not isinstance(signed_at, int)
        or isinstance(signed_at, bool)
        or not MIN_TIME_MS <= signed_at <= MAX_TIME_MS
    ):
        raise SignatureError(f"signature signed_at_ms {_short(signed_at)} is not a time in ms")
    if not isinstance(block["value"], str) or not _VALUE.fullmatch(block["value"]):
        raise SignatureError("signature value is not 64 bytes in lower-case hex")
    return block


def verify_commit(
    record: Mapping[str, Any], keys: ShufflerKeys, now_ms: int | None = None
) -> SigningPublicKey:
    """The trusted key whose signature ``record`` carries; SignatureError (one line) when the
    record is unsigned, its signature malformed, its key unknown, another instance's or outside
    its validity at the signing time, the signing time in the future, or the record altered."""
    block = _block(record)
    key_id, signed_at = block["key_id"], block["signed_at_ms"]
    key = keys.get(key_id)
    if key is None:
        raise SignatureError(f"signed by key {key_id}, which is not among the shuffler keys given")
    instance = record.get("instance")
    if instance != key.instance or isinstance(instance, bool):
        raise SignatureError(
            f"signed by key {key_id} of shuffler instance {key.instance}, but the commit states "
            f"instance {_short(instance)}"
        )
    if not key.valid_at(signed_at):
        raise SignatureError(
            f"signed at {format_time_ms(signed_at)} by key {key_id}, outside its validity "
            f"{_validity(key)} (expired or not yet valid)"
        )
    now = _now_ms() if now_ms is None else now_ms
    if signed_at > now + CLOCK_SKEW_MS:
        raise SignatureError(f"signed at {format_time_ms(signed_at)}, which is in the future")
    if not key.verify(bytes.fromhex(block["value"]), signed_message(record)):
        raise SignatureError(
            f"the Ed25519 signature does not verify under key {key_id}: the commit record was "
            "altered after signing"
        )
    return key
