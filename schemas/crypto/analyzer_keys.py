"""Analyzer key pairs for sealed reports: key files, key ids, validity windows and the key ring.

A key pair is an X25519 key of the RFC 9180 HPKE suite used by ``schemas.crypto.sealing``. Each key has
an 8-byte id (16 hex digits; by default the first 8 bytes of SHA-256 of the public key) and a
validity window ``[valid_from, valid_until)`` in event time: a message whose window lies outside
its key's validity was sealed to a retired (or not yet valid) key and is refused.

Files are JSON (format ``esa-key/1``):

* ``<key id>.public.json`` — id, suite, validity and the public key: given to devices (``esa
  simulate --public-key``) and safe to publish.
* ``<key id>.private.json`` — the same plus the private key; written with mode 0600 and read only
  by the analyzer's workers (``KeyRing.load`` inside ``DoFn.setup``), never placed in pipeline
  options or the pickled job graph, which carry only the path.

A key ring is a path: one private key file, or a directory of them (the current key and the
previous ones, so that reports sealed before a rotation still open).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

__all__ = [
    "KEY_FORMAT",
    "SUITE_NAME",
    "KEY_ID_BYTES",
    "KeyError_",
    "PublicKeyInfo",
    "PrivateKeyInfo",
    "KeyRing",
    "generate_key",
    "write_key_pair",
    "load_public_key",
    "parse_time_ms",
    "format_time_ms",
    "check_key_id",
    "hex_field",
    "default_key_id",
]

KEY_FORMAT = "esa-key/1"
SUITE_NAME = "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM"
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


@dataclass(frozen=True)
class PublicKeyInfo:
    """What a device needs: key id, validity and the raw 32-byte X25519 public key."""

    key_id: str
    public_bytes: bytes
    valid_from_ms: int = MIN_TIME_MS
    valid_until_ms: int = MAX_TIME_MS

    def __post_init__(self) -> None:
        check_key_id(self.key_id, "public key")
        if len(self.public_bytes) != 32:
            raise KeyError_(f"key {self.key_id}: public key must be 32 bytes")
        if not self.valid_from_ms < self.valid_until_ms:
            raise KeyError_(f"key {self.key_id}: valid_from must be before valid_until")

    @property
    def key_id_bytes(self) -> bytes:
        return bytes.fromhex(self.key_id)

    def public_key(self) -> x25519.X25519PublicKey:
        return x25519.X25519PublicKey.from_public_bytes(self.public_bytes)

    def valid_for(self, window_start_ms: int, window_end_ms: int) -> bool:
        """True when the window overlaps the key's validity."""
        return window_start_ms < self.valid_until_ms and window_end_ms > self.valid_from_ms

    def to_json(self) -> str:
        return json.dumps(self._fields(), indent=2) + "\n"

    def _fields(self) -> dict[str, Any]:
        return {
            "format": KEY_FORMAT,
            "kind": "public",
            "suite": SUITE_NAME,
            "key_id": self.key_id,
            "valid_from": format_time_ms(self.valid_from_ms),
            "valid_until": format_time_ms(self.valid_until_ms),
            "public_key": self.public_bytes.hex(),
        }

    @classmethod
    def from_json(cls, text: str, source: str = "<key>") -> PublicKeyInfo:
        data = _parse(text, source)
        return cls(
            key_id=check_key_id(data.get("key_id"), source),
            public_bytes=hex_field(data, "public_key", 32, source),
            valid_from_ms=parse_time_ms(data.get("valid_from", format_time_ms(MIN_TIME_MS))),
            valid_until_ms=parse_time_ms(data.get("valid_until", format_time_ms(MAX_TIME_MS))),
        )


@dataclass(frozen=True, repr=False)
class PrivateKeyInfo:
    """An analyzer key: its public half plus the private key (never repr'd, never pickled into a
    job graph: build it on the worker from its file)."""

    public: PublicKeyInfo
    private_key: x25519.X25519PrivateKey

    def __repr__(self) -> str:
        return f"PrivateKeyInfo(key_id={self.public.key_id!r})"

    def __reduce__(self) -> Any:
        raise TypeError("private keys are read on the worker from their file and never pickled")

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def to_json(self) -> str:
        raw = self.private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        fields = self.public._fields() | {"kind": "private", "private_key": raw.hex()}
        return json.dumps(fields, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<key>") -> PrivateKeyInfo:
        data = _parse(text, source)
        if data.get("kind") != "private":
            raise KeyError_(f"{source}: not a private key file (kind {data.get('kind')!r})")
        private_key = x25519.X25519PrivateKey.from_private_bytes(
            hex_field(data, "private_key", 32, source)
        )
        public = PublicKeyInfo.from_json(text, source)
        derived = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        if derived != public.public_bytes:
            raise KeyError_(f"{source}: private and public key do not belong together")
        return cls(public, private_key)


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


def _parse(text: str, source: str) -> Mapping[str, Any]:
    return parse_key_file(text, source, SUITE_NAME)


def hex_field(data: Mapping[str, Any], name: str, size: int, source: str) -> bytes:
    """Field ``name`` of a key file: ``size`` bytes in hex (KeyError_ naming ``source``)."""
    try:
        value = bytes.fromhex(data[name])
    except (KeyError, TypeError, ValueError) as error:
        raise KeyError_(f"{source}: field {name!r} must be {size} bytes in hex") from error
    if len(value) != size:
        raise KeyError_(f"{source}: field {name!r} must be {size} bytes in hex")
    return value


def generate_key(
    valid_from_ms: int = MIN_TIME_MS,
    valid_until_ms: int = MAX_TIME_MS,
    key_id: str | None = None,
) -> PrivateKeyInfo:
    """A fresh X25519 key pair (the library's CSPRNG) with its id and validity."""
    private_key = x25519.X25519PrivateKey.generate()
    public_bytes = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    public = PublicKeyInfo(
        key_id=key_id or default_key_id(public_bytes),
        public_bytes=public_bytes,
        valid_from_ms=valid_from_ms,
        valid_until_ms=valid_until_ms,
    )
    return PrivateKeyInfo(public, private_key)


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


def load_public_key(path: str | os.PathLike[str]) -> PublicKeyInfo:
    """A public key file (a private key file also works: only its public half is read)."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise KeyError_(f"public key {path}: cannot be read: {error.strerror}") from error
    return PublicKeyInfo.from_json(text, str(path))


class KeyRing:
    """The analyzer's private keys by id (current and previous keys)."""

    def __init__(self, keys: Iterable[PrivateKeyInfo]) -> None:
        self._keys: dict[bytes, PrivateKeyInfo] = {}
        for key in keys:
            if key.public.key_id_bytes in self._keys:
                raise KeyError_(f"key ring holds key id {key.key_id} twice")
            self._keys[key.public.key_id_bytes] = key
        if not self._keys:
            raise KeyError_("key ring is empty")

    def __reduce__(self) -> Any:
        raise TypeError("key rings are loaded on the worker from their path and never pickled")

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[PrivateKeyInfo]:
        return iter(self._keys.values())

    def get(self, key_id: bytes) -> PrivateKeyInfo | None:
        return self._keys.get(bytes(key_id))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyRing:
        """Every ``*.private.json`` under a directory, or one private key file."""
        location = Path(path)
        if location.is_dir():
            files = sorted(location.glob(f"*{PRIVATE_SUFFIX}"))
            if not files:
                raise KeyError_(f"key ring {location}: no *{PRIVATE_SUFFIX} files")
        elif location.is_file():
            files = [location]
        else:
            raise KeyError_(f"key ring {location}: no such file or directory")
        keys = []
        for file in files:
            try:
                text = file.read_text()
            except OSError as error:
                raise KeyError_(f"key {file}: cannot be read: {error.strerror}") from error
            keys.append(PrivateKeyInfo.from_json(text, str(file)))
        return cls(keys)
