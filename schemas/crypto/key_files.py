"""Key files of every party (format ``esa-key/1``): ids, validity times, JSON parsing and writing
a key pair (private file 0600, created exclusively). The analyzer's HPKE keys
(``schemas.crypto.analyzer_keys``) and the shufflers' signing keys (``schemas.crypto.signing_keys``)
share this module; neither imports the other, so a shuffler never loads code that reads an
analyzer key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

KEY_FORMAT = "esa-key/1"
KEY_ID_BYTES = 8


PRIVATE_MODE = 0o600


PUBLIC_SUFFIX = ".public.json"


PRIVATE_SUFFIX = ".private.json"


# Validity bounds: the Unix epoch up to the end of year 9999 (what event times may hold).
MIN_TIME_MS = 0


MAX_TIME_MS = 253_402_300_799_999


_KEY_ID = re.compile(r"^[0-9a-f]{16}$")


class KeyError_(ValueError):  # noqa: N801 - not the builtin KeyError
    """A key file that cannot be used; the message names the file and the problem."""


def parse_time_ms(text: str | int) -> int:
    """Milliseconds since the epoch from an ISO date/time (UTC unless it says otherwise) or int."""
    if isinstance(text, int):
        value = text
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as error:
            raise KeyError_(f"not an ISO date or time: {text!r}") from error
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        value = int(moment.timestamp() * 1000)
    if not MIN_TIME_MS <= value <= MAX_TIME_MS:
        raise KeyError_(f"time {text!r} is outside 1970-01-01 .. 9999-12-31")
    return value


def format_time_ms(ms: int) -> str:
    """ISO 8601 (UTC, ``Z``) of milliseconds since the epoch: how key files state validity."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def default_key_id(public_bytes: bytes) -> str:
    """The first 8 bytes of SHA-256 of the raw public key, as 16 hex digits."""
    return hashlib.sha256(public_bytes).digest()[:KEY_ID_BYTES].hex()


def check_key_id(key_id: str, source: str) -> str:
    """``key_id`` when it is 16 lower-case hex digits (KeyError_ naming ``source`` otherwise)."""
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise KeyError_(f"{source}: key id must be 16 lower-case hex digits, got {key_id!r}")
    return key_id


def parse_key_file(text: str, source: str, suite: str, what: str = "") -> Mapping[str, Any]:
    """The fields of an ``esa-key/1`` file of ``suite`` (KeyError_ naming ``source`` otherwise;
    ``what`` says, in the refusal, what kind of key the file should have been)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise KeyError_(f"{source}: not a key file: {error}") from error
    if not isinstance(data, dict) or data.get("format") != KEY_FORMAT:
        raise KeyError_(f"{source}: not an {KEY_FORMAT} key file")
    if data.get("suite") != suite:
        refusal = f"{source}: suite {str(data.get('suite'))[:80]!r} is not {suite!r}"
        raise KeyError_(refusal + (f" ({what})" if what else ""))
    return data


def hex_field(data: Mapping[str, Any], name: str, size: int, source: str) -> bytes:
    """Field ``name`` of a key file: ``size`` bytes in hex (KeyError_ naming ``source``)."""
    try:
        value = bytes.fromhex(data[name])
    except (KeyError, TypeError, ValueError) as error:
        raise KeyError_(f"{source}: field {name!r} must be {size} bytes in hex") from error
    if len(value) != size:
        raise KeyError_(f"{source}: field {name!r} must be {size} bytes in hex")
    return value


class _KeyPair(Protocol):
    """A private key object that writes its two files (analyzer or shuffler signing key)."""

    @property
    def key_id(self) -> str: ...

    @property
    def public(self) -> Any: ...

    def to_json(self) -> str: ...


def write_key_pair(key: _KeyPair, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``<id>.private.json`` (mode 0600, created exclusively) and ``<id>.public.json``."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    private_path = folder / f"{key.key_id}{PRIVATE_SUFFIX}"
    public_path = folder / f"{key.key_id}{PUBLIC_SUFFIX}"
    private_text, public_text = key.to_json(), key.public.to_json()
    for path in (private_path, public_path):
        if path.exists():
            raise KeyError_(f"{path} exists; choose another --output or --key-id")
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(private_text)
    os.chmod(private_path, PRIVATE_MODE)  # regardless of the umask
    public_path.write_text(public_text)
    return private_path, public_path
