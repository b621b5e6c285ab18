"""Avro schemas of the ESA messages and the few helpers that load, validate and checksum them.

Versioning rule: every record carries ``schema_version``. A reader accepts the versions listed in
``SUPPORTED_SCHEMA_VERSIONS`` and sends any other version to the dead-letter output with reason
``unknown_schema_version``; it never crashes and never guesses. A new version may only add fields
with defaults (Avro schema resolution keeps old files readable); a change in meaning is a new
version number.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import fastavro
import google_crc32c

SCHEMA_DIR = Path(__file__).resolve().parent
SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

REPORT = "report"
SHUFFLED_MESSAGE = "shuffled_message"
DEAD_LETTER = "dead_letter"
MANIFEST = "manifest"


@functools.cache
def schema_json(name: str) -> dict[str, Any]:
    """The raw JSON of ``schemas/<name>.avsc`` (parsed once per process)."""
    path = SCHEMA_DIR / f"{name}.avsc"
    if not path.is_file():
        raise ValueError(f"unknown schema {name!r}: no {path.name} in {SCHEMA_DIR}")
    return json.loads(path.read_text())


@functools.cache
def parsed_schema(name: str) -> dict[str, Any]:
    """The fastavro-parsed schema ``schemas/<name>.avsc`` (parsed once per process)."""
    return fastavro.parse_schema(schema_json(name))


def crc32c(payload: bytes) -> int:
    """CRC32C (Castagnoli) of ``payload`` as an unsigned 32-bit integer."""
    return google_crc32c.value(payload)
