"""Dead-letter records (``schemas/dead_letter.avsc``): what a stage rejected, why, and from where.

Records are validated in batches where they are read (``transforms.shuffler.report_rows``,
``transforms.analyzer.arithmetic``); the Avro codec is :mod:`schemas.avro`.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["dead_letter"]

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
