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
directory of ``*.public.json`` files with a trust file ``trusted_shufflers.json`` that pins the
key ids the analyzer trusts per instance; a key in the folder that the trust file does not name
is never trusted).

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
from schemas.regular_files import check_private_mode, read_text, read_text_and_mode

__all__ = [
    "SIGNING_SUITE",
    "MAX_INSTANCE",
    "SigningPublicKey",
    "SigningKey",
    "ShufflerKeys",
    "generate_signing_key",
    "load_signing_key",
    "load_shuffler_keys",
    "read_trusted_shufflers",
    "trust_shuffler_key",
    "TRUST_FILE",
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
        return read_text(path)
    except (OSError, UnicodeDecodeError) as error:
        raise KeyError_(f"signing key {path}: cannot be read: {error}") from error


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """A shuffler's private signing key file."""
    location = Path(path)
    if not location.is_file():
        raise KeyError_(f"signing key {location}: no such file")
    try:
        text, mode = read_text_and_mode(location)
    except (OSError, UnicodeDecodeError) as error:
        raise KeyError_(f"signing key {location}: cannot be read: {error}") from error
    key = SigningKey.from_json(text, str(location))
    try:
        check_private_mode(location, mode)  # as ssh does, once it is known to be private
    except OSError as error:
        raise KeyError_(f"signing key {location}: {error}") from None
    return key


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
    """One public (or private: only its public half is read) signing key file, or the keys a
    directory's trust file :data:`TRUST_FILE` pins per instance (never simply every
    ``*.public.json`` there: a key dropped into the folder is not trusted)."""
    location = Path(path)
    if location.is_dir():
        pinned = read_trusted_shufflers(location)
        keys = []
        for instance, key_ids in sorted(pinned.items()):
            for key_id in key_ids:
                file = location / f"{key_id}{PUBLIC_SUFFIX}"
                if not file.is_file():
                    raise KeyError_(
                        f"shuffler keys {location}: {TRUST_FILE} pins key {key_id} for instance "
                        f"{instance}, but {file.name} is missing"
                    )
                key = SigningPublicKey.from_json(_read(file), str(file))
                if key.instance != instance:
                    raise KeyError_(
                        f"shuffler keys {location}: {TRUST_FILE} pins key {key_id} for instance "
                        f"{instance}, but {file.name} is instance {key.instance}'s"
                    )
                keys.append(key)
        return ShufflerKeys(keys, str(location))
    if location.is_file():
        return ShufflerKeys([SigningPublicKey.from_json(_read(location), str(location))], str(path))
    raise KeyError_(f"shuffler keys {location}: no such file or directory")


# -- The trust file: which key ids the analyzer trusts for which instance ----------------------

TRUST_FILE = "trusted_shufflers.json"
TRUST_FORMAT = "esa-trusted-shufflers/1"


def read_trusted_shufflers(directory: str | os.PathLike[str]) -> dict[int, list[str]]:
    """Instance -> pinned key ids of ``directory/trusted_shufflers.json`` (KeyError_ if it is
    missing or malformed)."""
    path = Path(directory) / TRUST_FILE
    if not path.exists():
        raise KeyError_(
            f"shuffler keys {directory}: no {TRUST_FILE} pinning key ids per instance (esa keys "
            "generate --shuffler-instance writes it); not trusting every key in a folder"
        )
    try:
        data = json.loads(_read(path))
    except ValueError as error:
        raise KeyError_(f"{path}: not JSON: {error}") from None
    instances = data.get("instances") if isinstance(data, dict) else None
    if data.get("format") != TRUST_FORMAT or not isinstance(instances, dict) or not instances:
        raise KeyError_(f"{path}: not an {TRUST_FORMAT} file with instances")
    pinned: dict[int, list[str]] = {}
    for name, key_ids in instances.items():
        if not name.isdigit() or int(name) > MAX_INSTANCE or not isinstance(key_ids, list):
            raise KeyError_(f"{path}: instances must map instance numbers to key id lists")
        pinned[int(name)] = [check_key_id(key_id, str(path)) for key_id in key_ids]
    return pinned


def trust_shuffler_key(directory: str | os.PathLike[str], key: SigningPublicKey) -> Path:
    """Add ``key``'s id to ``directory``'s trust file for its instance (created if absent;
    written atomically). What ``esa keys generate --shuffler-instance`` and ``esa run`` call."""
    path = Path(directory) / TRUST_FILE
    pinned = read_trusted_shufflers(directory) if path.exists() else {}
    ids = pinned.setdefault(key.instance, [])
    if key.key_id not in ids:
        ids.append(key.key_id)
    body = {
        "format": TRUST_FORMAT,
        "instances": {str(u): ids for u, ids in sorted(pinned.items())},
    }
    temporary = path.with_name(f".{TRUST_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)
    return path
