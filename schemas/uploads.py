"""The upload protocol between a device and its shuffler instance's collector (``esa-upload/1``).

A device sends ``POST /v1/reports`` over HTTPS with

* a body: an Avro object container file of Report records (``schemas/report.avsc``, media type
  ``avro/binary``): its messages for this instance. Whatever ``origin`` the records hold is
  ignored: the collector writes the origin of the credential that signed the upload;
* the headers ``ESA-Device`` (the enrolment key id, ``schemas/crypto/device_keys.py``),
  ``ESA-Timestamp`` (ms since the epoch, the device clock), ``ESA-Nonce`` (16-64 hex digits,
  fresh per attempt), ``ESA-Report-Id`` (8-64 characters ``[A-Za-z0-9_-]``, chosen by the device
  and kept across retries: the collector stores an upload once per device and report id) and
  ``ESA-Signature`` (Ed25519 over :func:`signed_message`, hex).

The signature covers the instance (an upload for instance 0 is refused by instance 1's
collector), the device, timestamp, nonce, report id and the SHA-256 of the body.
"""

from __future__ import annotations

import hashlib
import os
import re

__all__ = [
    "PATH",
    "MEDIA_TYPE",
    "DEVICE",
    "TIMESTAMP",
    "NONCE",
    "REPORT_ID",
    "SIGNATURE",
    "signed_message",
    "valid_nonce",
    "valid_report_id",
    "new_nonce",
    "upload_headers",
]

PATH = "/v1/reports"
MEDIA_TYPE = "avro/binary"
CONTEXT = "esa-upload/1"
DEVICE = "ESA-Device"
TIMESTAMP = "ESA-Timestamp"
NONCE = "ESA-Nonce"
REPORT_ID = "ESA-Report-Id"
SIGNATURE = "ESA-Signature"
_NONCE = re.compile(r"^[0-9a-f]{16,64}$")
_REPORT_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


def signed_message(
    instance: int, device: str, timestamp_ms: int, nonce: str, report_id: str, body: bytes
) -> bytes:
    """The bytes a device signs for one upload attempt."""
    digest = hashlib.sha256(body).hexdigest()
    fields = (CONTEXT, str(instance), device, str(timestamp_ms), nonce, report_id, digest)
    return "\n".join(fields).encode()


def valid_nonce(text: str) -> bool:
    return bool(_NONCE.match(text))


def valid_report_id(text: str) -> bool:
    return bool(_REPORT_ID.match(text))


def new_nonce() -> str:
    return os.urandom(16).hex()


def upload_headers(
    credential: object, instance: int, report_id: str, body: bytes, timestamp_ms: int
) -> dict[str, str]:
    """The headers of one attempt of an upload, signed with ``credential`` (a
    ``schemas.crypto.device_keys.DeviceCredential``); a fresh nonce each call."""
    nonce = new_nonce()
    key_id = credential.key_id  # type: ignore[attr-defined]
    message = signed_message(instance, key_id, timestamp_ms, nonce, report_id, body)
    return {
        "Content-Type": MEDIA_TYPE,
        DEVICE: key_id,
        TIMESTAMP: str(timestamp_ms),
        NONCE: nonce,
        REPORT_ID: report_id,
        SIGNATURE: credential.sign(message).hex(),  # type: ignore[attr-defined]
    }
