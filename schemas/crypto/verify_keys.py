"""The Prio3 verify key both aggregators share (draft-irtf-cfrg-vdaf-18 §9: secret from devices).

An ``esa-key/1`` file (``schemas.crypto.key_files``) of suite
:data:`VERIFY_KEY_SUITE` with one field, ``verify_key`` (VERIFY_KEY_SIZE bytes in hex), written
with mode 0600 and never overwritten; read by each aggregator's workers from its path.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from schemas.crypto.key_files import (
    KEY_FORMAT,
    PRIVATE_MODE,
    KeyError_,
    hex_field,
    parse_key_file,
)
from schemas.crypto.vdaf import VDAF_DRAFT, VERIFY_KEY_SIZE, VdafError

__all__ = ["VERIFY_KEY_SUITE", "generate_verify_key", "write_verify_key", "load_verify_key"]

VERIFY_KEY_SUITE = f"Prio3 verify key (VDAF draft {VDAF_DRAFT})"


def generate_verify_key() -> bytes:
    """A fresh verify key from the operating system's CSPRNG."""
    return secrets.token_bytes(VERIFY_KEY_SIZE)


def write_verify_key(path: str | os.PathLike[str], verify_key: bytes) -> Path:
    """Writes ``verify_key`` as an ``esa-key/1`` file, mode 0600, refusing to overwrite."""
    if not isinstance(verify_key, bytes) or len(verify_key) != VERIFY_KEY_SIZE:
        size = len(verify_key) if isinstance(verify_key, bytes) else type(verify_key).__name__
        raise VdafError(f"verify_key must be {VERIFY_KEY_SIZE} bytes, got {size}")
    key = verify_key
    location = Path(path)
    location.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": KEY_FORMAT, "suite": VERIFY_KEY_SUITE, "verify_key": key.hex()})
    try:
        descriptor = os.open(location, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    except FileExistsError as error:
        raise KeyError_(f"verify key {location}: exists; choose another path") from error
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text + "\n")
    os.chmod(location, PRIVATE_MODE)  # regardless of the umask
    return location


def load_verify_key(path: str | os.PathLike[str]) -> bytes:
    """The verify key of an ``esa-key/1`` file (KeyError_ naming the file otherwise)."""
    location = Path(path)
    try:
        text = location.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise KeyError_(f"verify key {location}: cannot be read: {error}") from error
    data = parse_key_file(text, f"verify key {location}", VERIFY_KEY_SUITE)
    return hex_field(data, "verify_key", VERIFY_KEY_SIZE, f"verify key {location}")
