"""Dead-letter records."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

import schemas
from schemas import dead_letters


def report(**overrides) -> dict:
    payload = overrides.pop("payload", b"\x02\x0a")
    base = {
        "schema_version": 1,
        "shuffler_instance": 0,
        "channel": "location_heatmap",
        "recipe_id": "image_grid_onehot@1",
        "crowd_id": None,
        "min_crowd_size": 100,
        "origin": "device-17",
        "event_time": 1_700_000_000_000,
        "payload": payload,
        "payload_crc32c": schemas.crc32c(payload),
    }
    base.update(overrides)
    return base


def test_dead_letters_fit_their_schema_and_keep_the_record() -> None:
    letter = dead_letters.dead_letter(
        "shuffle.validate", "crc_mismatch", "bad crc", "reports.avro@123", original_record=report()
    )
    buffer = io.BytesIO()
    fastavro.writer(buffer, schemas.parsed_schema(schemas.DEAD_LETTER), [letter])
    buffer.seek(0)
    (read_back,) = fastavro.reader(buffer)
    assert read_back == letter
    kept = json.loads(letter["original_record"])
    assert kept["origin"] == "device-17" and kept["payload"] == "Ago="  # base64 of b"\x02\x0a"
    with pytest.raises(ValueError, match="reason"):
        dead_letters.dead_letter("stage", "", "", "")
