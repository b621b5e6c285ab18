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

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from schemas.crypto.key_files import (  # noqa: F401 - re-exported for the analyzer's key users
    KEY_FORMAT,
    KEY_ID_BYTES,
    MAX_TIME_MS,
    MIN_TIME_MS,
    PRIVATE_MODE,
    PRIVATE_SUFFIX,
    PUBLIC_SUFFIX,
    KeyError_,
    check_key_id,
    default_key_id,
    format_time_ms,
    hex_field,
    parse_key_file,
    parse_time_ms,
    write_key_pair,
)

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

SUITE_NAME = "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM"


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


def _parse(text: str, source: str) -> Mapping[str, Any]:
    return parse_key_file(text, source, SUITE_NAME)
