"""Shuffler signing keys: Ed25519 key files bound to one shuffler instance.

Each shuffler instance signs the commit record of its release (``schemas/crypto/commit_signing.py``) with
its own Ed25519 key (RFC 8032, from ``cryptography``). The key files follow the analyzer keys'
conventions (``schemas/crypto/analyzer_keys.py``: JSON format ``esa-key/1``, a 16-hex-digit key id, by default
from SHA-256 of the public key, a validity window ``[valid_from, valid_until)``, private files
mode 0600, public files safe to publish) and add two fields:

* ``"suite": "Ed25519"`` (a sealing key's suite is the HPKE one: neither loads as the other);
* ``"shuffler_instance": u``: the only instance whose commits the key may sign. A key of
  instance 0 never verifies a commit that states instance 1.

``<key id>.private.json`` stays with its shuffler (``esa shuffle --signing-key``, read on the
driver when the commit is written, never in pipeline options or the job graph);
``<key id>.public.json`` goes to the analyzer (``esa analyze --shuffler-keys``: one file, or a
directory of ``*.public.json`` files, one or more per instance).

Pure: the standard library and ``cryptography``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from schemas.crypto.key_files import (
    KEY_FORMAT,
    MAX_TIME_MS,
    MIN_TIME_MS,
    PUBLIC_SUFFIX,
    KeyError_,
    check_key_id,
    default_key_id,
    format_time_ms,
    hex_field,
    parse_key_file,
    parse_time_ms,
)

__all__ = [
    "SIGNING_SUITE",
    "MAX_INSTANCE",
    "SigningPublicKey",
    "SigningKey",
    "ShufflerKeys",
    "generate_signing_key",
    "load_signing_key",
    "load_shuffler_keys",
]

SIGNING_SUITE = "Ed25519"
MAX_INSTANCE = 2**31 - 1  # an Avro int, as the commit record's instance
_RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _instance(value: Any, source: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INSTANCE:
        raise KeyError_(f"{source}: shuffler_instance must be an int in [0, 2^31 - 1]")
    return value


@dataclass(frozen=True)
class SigningPublicKey:
    """What the analyzer needs to check one instance's commits: id, instance, validity and the
    raw 32-byte Ed25519 public key."""

    key_id: str
    public_bytes: bytes
    instance: int
    valid_from_ms: int = MIN_TIME_MS
    valid_until_ms: int = MAX_TIME_MS

    def __post_init__(self) -> None:
        check_key_id(self.key_id, "signing key")
        _instance(self.instance, f"signing key {self.key_id}")
        if len(self.public_bytes) != 32:
            raise KeyError_(f"signing key {self.key_id}: public key must be 32 bytes")
        if not self.valid_from_ms < self.valid_until_ms:
            raise KeyError_(f"signing key {self.key_id}: valid_from must be before valid_until")

    def valid_at(self, time_ms: int) -> bool:
        return self.valid_from_ms <= time_ms < self.valid_until_ms

    def verify(self, signature: bytes, message: bytes) -> bool:
        """Whether ``signature`` is this key's Ed25519 signature of ``message``."""
        from cryptography.exceptions import InvalidSignature

        try:
            ed25519.Ed25519PublicKey.from_public_bytes(self.public_bytes).verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def fields(self) -> dict[str, Any]:
        return {
            "format": KEY_FORMAT,
            "kind": "public",
            "suite": SIGNING_SUITE,
            "shuffler_instance": self.instance,
            "key_id": self.key_id,
            "valid_from": format_time_ms(self.valid_from_ms),
            "valid_until": format_time_ms(self.valid_until_ms),
            "public_key": self.public_bytes.hex(),
        }

    def to_json(self) -> str:
        return json.dumps(self.fields(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<key>") -> SigningPublicKey:
        data = _parse(text, source)
        return cls(
            key_id=check_key_id(data.get("key_id"), source),
            public_bytes=hex_field(data, "public_key", 32, source),
            instance=_instance(data.get("shuffler_instance"), source),
            valid_from_ms=parse_time_ms(data.get("valid_from", format_time_ms(MIN_TIME_MS))),
            valid_until_ms=parse_time_ms(data.get("valid_until", format_time_ms(MAX_TIME_MS))),
        )


@dataclass(frozen=True, repr=False)
class SigningKey:
    """One shuffler instance's private signing key (never repr'd, never pickled)."""

    public: SigningPublicKey
    private_key: ed25519.Ed25519PrivateKey

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self.public.key_id!r}, instance={self.public.instance})"

    def __reduce__(self) -> Any:
        raise TypeError("signing keys are read on the driver from their file and never pickled")

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def to_json(self) -> str:
        raw = self.private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        fields = self.public.fields() | {"kind": "private", "private_key": raw.hex()}
        return json.dumps(fields, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<key>") -> SigningKey:
        data = _parse(text, source)
        if data.get("kind") != "private":
            raise KeyError_(f"{source}: not a private key file (kind {data.get('kind')!r})")
        private_key = ed25519.Ed25519PrivateKey.from_private_bytes(
            hex_field(data, "private_key", 32, source)
        )
        public = SigningPublicKey.from_json(text, source)
        if private_key.public_key().public_bytes(*_RAW) != public.public_bytes:
            raise KeyError_(f"{source}: private and public key do not belong together")
        return cls(public, private_key)


def _parse(text: str, source: str) -> Mapping[str, Any]:
    return parse_key_file(text, source, SIGNING_SUITE, "not a shuffler signing key")


def generate_signing_key(
    instance: int,
    valid_from_ms: int = MIN_TIME_MS,
    valid_until_ms: int = MAX_TIME_MS,
    key_id: str | None = None,
) -> SigningKey:
    """A fresh Ed25519 key (the library's CSPRNG) for shuffler ``instance``."""
    private_key = ed25519.Ed25519PrivateKey.generate()
    public_bytes = private_key.public_key().public_bytes(*_RAW)
    public = SigningPublicKey(
        key_id=key_id or default_key_id(public_bytes),
        public_bytes=public_bytes,
        instance=instance,
        valid_from_ms=valid_from_ms,
        valid_until_ms=valid_until_ms,
    )
    return SigningKey(public, private_key)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise KeyError_(f"signing key {path}: cannot be read: {error}") from error


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """A shuffler's private signing key file."""
    location = Path(path)
    if not location.is_file():
        raise KeyError_(f"signing key {location}: no such file")
    return SigningKey.from_json(_read(location), str(location))


class ShufflerKeys:
    """The shufflers' public signing keys the analyzer trusts, by key id."""

    def __init__(self, keys: Iterable[SigningPublicKey], source: str = "<keys>") -> None:
        self.source = source
        self._keys: dict[str, SigningPublicKey] = {}
        for key in keys:
            if key.key_id in self._keys:
                raise KeyError_(f"{source}: key id {key.key_id} twice")
            self._keys[key.key_id] = key
        if not self._keys:
            raise KeyError_(f"{source}: no shuffler signing key")

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[SigningPublicKey]:
        return iter(self._keys.values())

    def get(self, key_id: str) -> SigningPublicKey | None:
        return self._keys.get(key_id)


def load_shuffler_keys(path: str | os.PathLike[str]) -> ShufflerKeys:
    """One public (or private: only its public half is read) signing key file, or every
    ``*.public.json`` in a directory."""
    location = Path(path)
    if location.is_dir():
        files = sorted(location.glob(f"*{PUBLIC_SUFFIX}"))
        if not files:
            raise KeyError_(f"shuffler keys {location}: no *{PUBLIC_SUFFIX} files")
    elif location.is_file():
        files = [location]
    else:
        raise KeyError_(f"shuffler keys {location}: no such file or directory")
    keys = [SigningPublicKey.from_json(_read(file), str(file)) for file in files]
    return ShufflerKeys(keys, str(location))
