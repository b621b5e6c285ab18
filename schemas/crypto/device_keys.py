"""Device enrolment credentials: one Ed25519 key pair per device (RFC 8032, from ``cryptography``).

``esa keys enrol --devices N --output DIR`` writes

* ``DIR/devices.registry.json`` (format ``esa-device-registry/1``): every enrolled device's key
  id and raw public key. The collectors load it (``esa collect --registry``); it holds nothing
  secret.
* ``DIR/devices.private.jsonl`` (mode 0600, created exclusively): one line per device with its
  key id and raw private key. A real device holds its own line only; the simulated fleet holds
  them all (``esa simulate --device-credentials``).

A key id is the first 8 bytes of SHA-256 of the public key (``schemas/crypto/key_files.py``).
The collector names the device in the reports it stores by :func:`origin_for` its key id: the
origin is a property of the credential that signed the upload, never a field the device writes.

Pure: the standard library and ``cryptography``. Nothing here reads an analyzer key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from schemas.crypto.key_files import PRIVATE_MODE, KeyError_, check_key_id, default_key_id

__all__ = [
    "REGISTRY_FORMAT",
    "REGISTRY_FILE",
    "PRIVATE_FILE",
    "ORIGIN_PREFIX",
    "DeviceCredential",
    "DeviceRegistry",
    "origin_for",
    "enrol_devices",
    "load_registry",
    "load_credentials",
]

REGISTRY_FORMAT = "esa-device-registry/1"
REGISTRY_FILE = "devices.registry.json"
PRIVATE_FILE = "devices.private.jsonl"
ORIGIN_PREFIX = "device-"
SUITE = "Ed25519"
MAX_DEVICES = 10_000_000
_RAW_PUBLIC = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
_RAW_PRIVATE = (
    serialization.Encoding.Raw,
    serialization.PrivateFormat.Raw,
    serialization.NoEncryption(),
)


def origin_for(key_id: str) -> str:
    """The origin the collector stamps on every report signed by device ``key_id``: stable,
    one per enrolled credential."""
    return ORIGIN_PREFIX + key_id


@dataclass(frozen=True, repr=False)
class DeviceCredential:
    """One device's private enrolment key (never repr'd, never pickled)."""

    key_id: str
    private_key: ed25519.Ed25519PrivateKey

    def __repr__(self) -> str:
        return f"DeviceCredential(key_id={self.key_id!r})"

    def __reduce__(self) -> Any:
        raise TypeError("device credentials are read from their file and never pickled")

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def public_bytes(self) -> bytes:
        return self.private_key.public_key().public_bytes(*_RAW_PUBLIC)


class DeviceRegistry:
    """Enrolled devices' public keys by key id: what a collector authenticates uploads with."""

    def __init__(self, devices: Iterable[tuple[str, bytes]], source: str = "<registry>") -> None:
        self.source = source
        self._keys: dict[str, ed25519.Ed25519PublicKey] = {}
        for key_id, public_bytes in devices:
            if key_id in self._keys:
                raise KeyError_(f"{source}: device key id {key_id} twice")
            if default_key_id(public_bytes) != key_id:
                raise KeyError_(f"{source}: device {key_id}: key id is not its public key's")
            self._keys[key_id] = ed25519.Ed25519PublicKey.from_public_bytes(public_bytes)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def verify(self, key_id: str, signature: bytes, message: bytes) -> bool:
        """Whether ``signature`` is enrolled device ``key_id``'s signature of ``message``
        (False for an unknown device)."""
        key = self._keys.get(key_id)
        if key is None:
            return False
        try:
            key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


def enrol_devices(count: int, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Make ``count`` fresh device key pairs (the library's CSPRNG); write the registry and the
    private keys (0600, created exclusively; an existing file is refused)."""
    if not 1 <= count <= MAX_DEVICES:
        raise KeyError_(f"--devices must be in [1, {MAX_DEVICES:,}], got {count}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    registry_path, private_path = folder / REGISTRY_FILE, folder / PRIVATE_FILE
    for path in (registry_path, private_path):
        if path.exists():
            raise KeyError_(f"{path} exists; choose another --output")
    public_entries, private_lines = [], []
    seen: set[str] = set()
    while len(public_entries) < count:
        private_key = ed25519.Ed25519PrivateKey.generate()
        public_bytes = private_key.public_key().public_bytes(*_RAW_PUBLIC)
        key_id = default_key_id(public_bytes)
        if key_id in seen:  # 64-bit ids: a collision is astronomically rare; draw again
            continue
        seen.add(key_id)
        public_entries.append({"key_id": key_id, "public_key": public_bytes.hex()})
        raw = private_key.private_bytes(*_RAW_PRIVATE)
        private_lines.append(json.dumps({"key_id": key_id, "private_key": raw.hex()}))
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    with os.fdopen(descriptor, "w") as handle:
        handle.write("\n".join(private_lines) + "\n")
    os.chmod(private_path, PRIVATE_MODE)  # regardless of the umask
    registry = {"format": REGISTRY_FORMAT, "suite": SUITE, "devices": public_entries}
    registry_path.write_text(json.dumps(registry) + "\n")
    return registry_path, private_path


def _registry_path(path: str | os.PathLike[str]) -> Path:
    location = Path(path)
    return location / REGISTRY_FILE if location.is_dir() else location


def load_registry(path: str | os.PathLike[str]) -> DeviceRegistry:
    """A device registry file (or the directory ``esa keys enrol`` wrote)."""
    location = _registry_path(path)
    try:
        data = json.loads(location.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise KeyError_(f"device registry {location}: cannot be read: {error}") from error
    if not isinstance(data, dict) or data.get("format") != REGISTRY_FORMAT:
        raise KeyError_(f"device registry {location}: not an {REGISTRY_FORMAT} file")
    if data.get("suite") != SUITE or not isinstance(data.get("devices"), list):
        raise KeyError_(f"device registry {location}: needs suite {SUITE} and a devices list")
    entries = []
    for index, entry in enumerate(data["devices"]):
        source = f"device registry {location}, device {index}"
        try:
            key_id = check_key_id(entry["key_id"], source)
            public_bytes = bytes.fromhex(entry["public_key"])
        except (KeyError, TypeError, ValueError) as error:
            raise KeyError_(f"{source}: needs key_id and a hex public_key") from error
        if len(public_bytes) != 32:
            raise KeyError_(f"{source}: public_key must be 32 bytes")
        entries.append((key_id, public_bytes))
    return DeviceRegistry(entries, str(location))


def load_credentials(path: str | os.PathLike[str]) -> list[DeviceCredential]:
    """Every device's private key from ``devices.private.jsonl`` (or the directory holding it),
    in enrolment order."""
    location = Path(path)
    if location.is_dir():
        location = location / PRIVATE_FILE
    try:
        lines = location.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise KeyError_(f"device credentials {location}: cannot be read: {error}") from error
    credentials = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        source = f"device credentials {location}:{number}"
        try:
            entry = json.loads(line)
            key_id = check_key_id(entry["key_id"], source)
            private_key = ed25519.Ed25519PrivateKey.from_private_bytes(
                bytes.fromhex(entry["private_key"])
            )
        except (KeyError, TypeError, ValueError) as error:
            raise KeyError_(f"{source}: needs key_id and a 32-byte hex private_key") from error
        credential = DeviceCredential(key_id, private_key)
        if default_key_id(credential.public_bytes()) != key_id:
            raise KeyError_(f"{source}: key id is not its public key's")
        credentials.append(credential)
    if not credentials:
        raise KeyError_(f"device credentials {location}: no device")
    return credentials
