"""Report and ShuffledMessage validation and dead-letter records."""

from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
import pytest

import schemas
from schemas import records


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


def shuffled(i: int) -> dict:
    payload = i.to_bytes(3, "little")
    return {
        "schema_version": 1,
        "window_start": 0,
        "window_end": 86_400_000,
        "channel": "c",
        "recipe_id": "r@1",
        "crowd_id": None if i % 2 else "en-US",
        "payload": payload,
        "payload_crc32c": schemas.crc32c(payload),
    }


def test_a_valid_report_passes() -> None:
    assert records.validate_report(report()) is None
    assert records.validate_report(report(crowd_id="en-US")) is None
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert records.validate_report(report(event_time=when)) is None


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ("not a dict", "not_a_record"),
        (report(schema_version=2), "unknown_schema_version"),
        ({k: v for k, v in report().items() if k != "origin"}, "missing_field"),
        (report(shuffler_instance="0"), "wrong_type"),
        (report(min_crowd_size=True), "wrong_type"),
        ({**report(), "payload": "text"}, "wrong_type"),
        (report(channel=None), "wrong_type"),
        (report(shuffler_instance=-1), "out_of_range"),
        (report(shuffler_instance=2**31), "out_of_range"),
        (report(min_crowd_size=0), "out_of_range"),
        (report(recipe_id="no-version"), "out_of_range"),
        (report(origin=""), "out_of_range"),
        (report(payload_crc32c=2**32), "out_of_range"),
        (report(payload_crc32c=12345), "crc_mismatch"),
    ],
)
def test_invalid_reports_get_a_reason(record: object, reason: str) -> None:
    assert records.validate_report(record) == reason
    problem = records.report_problem(record)
    assert problem is not None and problem[0] == reason and problem[1]


def test_crowd_id_may_be_missing_because_it_has_a_default() -> None:
    assert records.validate_report({k: v for k, v in report().items() if k != "crowd_id"}) is None


def test_shuffled_message_validation() -> None:
    assert records.validate_shuffled_message(shuffled(1)) is None
    assert records.validate_shuffled_message({**shuffled(1), "window_end": 0}) == "out_of_range"
    assert records.validate_shuffled_message({**shuffled(1), "payload_crc32c": 1}) == "crc_mismatch"


def test_dead_letters_fit_their_schema_and_keep_the_record() -> None:
    letter = records.dead_letter(
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
        records.dead_letter("stage", "", "", "")
