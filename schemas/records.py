"""Record helpers: validate Report and ShuffledMessage dicts and build dead-letter records.

Validation returns a reason code instead of raising (invariant 5 of DESIGN.md). Reading and writing
Avro container files lives in :mod:`transforms.avro_io`.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from schemas import (
    REPORT,
    SHUFFLED_MESSAGE,
    SUPPORTED_SCHEMA_VERSIONS,
    crc32c,
    schema_json,
)

__all__ = [
    "report_problem",
    "validate_report",
    "shuffled_message_problem",
    "validate_shuffled_message",
    "dead_letter",
]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _type_problem(record: Mapping[str, Any], schema_name: str) -> tuple[str, str] | None:
    """Missing fields and Avro type mismatches against ``schemas/<schema_name>.avsc``."""
    for avro_field in schema_json(schema_name)["fields"]:
        name, avro_type = avro_field["name"], avro_field["type"]
        if name not in record:
            if "default" in avro_field:
                continue
            return "missing_field", f"required field {name!r} is missing"
        value = record[name]
        nullable = isinstance(avro_type, list) and "null" in avro_type
        if isinstance(avro_type, list):
            avro_type = next(t for t in avro_type if t != "null")
        if value is None:
            if nullable:
                continue
            return "wrong_type", f"field {name!r} must not be null"
        logical = avro_type.get("logicalType") if isinstance(avro_type, dict) else None
        base = avro_type["type"] if isinstance(avro_type, dict) else avro_type
        if logical == "timestamp-millis" and isinstance(value, dt.datetime):
            continue
        if base in ("int", "long"):
            if not _is_int(value):
                return "wrong_type", f"field {name!r} must be an {base}, got {type(value).__name__}"
            low, high = _INT32 if base == "int" else _INT64
            if not low <= int(value) <= high:
                return "out_of_range", f"field {name!r}={value} does not fit an Avro {base}"
        elif base == "string":
            if not isinstance(value, str):
                return "wrong_type", f"field {name!r} must be a string, got {type(value).__name__}"
        elif base == "bytes":
            if not isinstance(value, bytes | bytearray | memoryview):
                return "wrong_type", f"field {name!r} must be bytes, got {type(value).__name__}"
    return None


def _common_problem(record: Any, schema_name: str) -> tuple[str, str] | None:
    if not isinstance(record, Mapping):
        return "not_a_record", f"expected a mapping, got {type(record).__name__}"
    version = record.get("schema_version")
    if _is_int(version) and int(version) not in SUPPORTED_SCHEMA_VERSIONS:
        return (
            "unknown_schema_version",
            f"schema_version {version} not in {sorted(SUPPORTED_SCHEMA_VERSIONS)}",
        )
    problem = _type_problem(record, schema_name)
    if problem:
        return problem
    for name in ("channel", "recipe_id"):
        if not record[name]:
            return "out_of_range", f"field {name!r} must not be empty"
    if "@" not in record["recipe_id"]:
        return "out_of_range", f"recipe_id {record['recipe_id']!r} is not name@version"
    if not _UINT32[0] <= int(record["payload_crc32c"]) <= _UINT32[1]:
        return "out_of_range", "payload_crc32c must be an unsigned 32-bit value"
    return None


def _crc_problem(record: Mapping[str, Any]) -> tuple[str, str] | None:
    actual = crc32c(bytes(record["payload"]))
    if actual != int(record["payload_crc32c"]):
        return "crc_mismatch", f"payload CRC32C is {actual}, record says {record['payload_crc32c']}"
    return None


def report_problem(record: Any, check_crc: bool = True) -> tuple[str, str] | None:
    """(reason code, detail) of the first problem with a Report dict, or None if it is valid.

    Reasons: not_a_record, unknown_schema_version, missing_field, wrong_type, out_of_range,
    crc_mismatch.
    """
    problem = _common_problem(record, REPORT)
    if problem:
        return problem
    if int(record["shuffler_instance"]) < 0:
        return "out_of_range", "shuffler_instance must be >= 0"
    if int(record["min_crowd_size"]) < 1:
        return "out_of_range", "min_crowd_size must be >= 1"
    if not record["origin"]:
        return "out_of_range", "origin must not be empty"
    return _crc_problem(record) if check_crc else None


def validate_report(record: Any, check_crc: bool = True) -> str | None:
    """The reason code why a Report dict is invalid, or None."""
    problem = report_problem(record, check_crc)
    return problem[0] if problem else None


def shuffled_message_problem(record: Any, check_crc: bool = True) -> tuple[str, str] | None:
    """(reason, detail) of the first problem with a ShuffledMessage dict, or None."""
    problem = _common_problem(record, SHUFFLED_MESSAGE)
    if problem:
        return problem
    start, end = record["window_start"], record["window_end"]
    if type(start) is type(end) and not start < end:
        return "out_of_range", "window_start must be before window_end"
    return _crc_problem(record) if check_crc else None


def validate_shuffled_message(record: Any, check_crc: bool = True) -> str | None:
    """The reason code why a ShuffledMessage dict is invalid, or None."""
    problem = shuffled_message_problem(record, check_crc)
    return problem[0] if problem else None


# ---------------------------------------------------------------------------------------------
# Dead letters
# ---------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return repr(value)


def dead_letter(
    stage: str,
    reason: str,
    detail: str,
    source: str,
    original_bytes: bytes | None = None,
    original_record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A DeadLetter record (``schemas/dead_letter.avsc``); bytes in the record become base64."""
    for name, value in (("stage", stage), ("reason", reason)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"dead letter {name} must be a non-empty string, got {value!r}")
    record_json = None
    if original_record is not None:
        record_json = json.dumps(dict(original_record), default=_json_default, sort_keys=True)
    return {
        "stage": stage,
        "reason": reason,
        "detail": str(detail),
        "source": str(source),
        "original_bytes": None if original_bytes is None else bytes(original_bytes),
        "original_record": record_json,
    }
