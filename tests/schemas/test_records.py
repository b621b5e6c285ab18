"""Report validation, dead letters and robust Avro container reading."""

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
    records.write_avro(buffer, schemas.DEAD_LETTER, [letter])
    buffer.seek(0)
    (read_back,) = fastavro.reader(buffer)
    assert read_back == letter
    kept = json.loads(letter["original_record"])
    assert kept["origin"] == "device-17" and kept["payload"] == "Ago="  # base64 of b"\x02\x0a"
    with pytest.raises(ValueError, match="reason"):
        records.dead_letter("stage", "", "", "")


def write_file(count: int, codec: str = "deflate", sync_interval: int = 400) -> bytes:
    buffer = io.BytesIO()
    records.write_avro(
        buffer, schemas.SHUFFLED_MESSAGE, (shuffled(i) for i in range(count)), codec, sync_interval
    )
    return buffer.getvalue()


@pytest.mark.parametrize("codec", records.READABLE_CODECS)
def test_blocks_round_trip_with_every_standard_library_codec(codec: str) -> None:
    data = write_file(100, codec)
    blocks = list(records.read_avro_bytes(data))
    assert len(blocks) > 1 and all(isinstance(b, records.AvroBlock) for b in blocks)
    read = [r for b in blocks for r in b.records]
    assert read == [shuffled(i) for i in range(100)]  # timestamps stay int milliseconds
    assert [b.offset for b in blocks[1:]] == [b.offset + b.size for b in blocks[:-1]]
    assert blocks[-1].offset + blocks[-1].size == len(data)


def test_logical_types_can_be_kept() -> None:
    (block,) = list(records.read_avro_blocks(io.BytesIO(write_file(1)), logical_types=True))
    assert block.records[0]["window_end"] == dt.datetime(1970, 1, 2, tzinfo=dt.UTC)


def test_writable_codecs_include_the_default_and_refuse_missing_libraries() -> None:
    assert records.DEFAULT_CODEC in records.writable_codecs()
    assert set(records.READABLE_CODECS) <= set(records.writable_codecs())
    unavailable = {"snappy", "zstandard", "lz4"} - set(records.writable_codecs())
    for codec in unavailable:
        with pytest.raises(ValueError, match="not available"):
            records.write_avro(io.BytesIO(), schemas.SHUFFLED_MESSAGE, [], codec=codec)


def test_a_corrupt_block_is_reported_and_the_rest_is_read() -> None:
    data = write_file(100)
    blocks = list(records.read_avro_bytes(data))
    victim = blocks[2]
    damaged = bytearray(data)
    damaged[victim.offset + victim.size // 2] ^= 0xFF
    results = list(records.read_avro_bytes(bytes(damaged), name="part-0.avro"))
    errors = [r for r in results if isinstance(r, records.ReadError)]
    assert len(errors) == 1
    (error,) = errors
    assert error.reason == records.CORRUPT_BLOCK and error.position == victim.offset
    assert error.records_lost == len(victim.records)
    assert error.location == f"part-0.avro@{victim.offset}"
    good = [r for r in results if isinstance(r, records.AvroBlock)]
    assert [b.offset for b in good] == [b.offset for b in blocks if b is not victim]
    letter = records.dead_letter_for_error("analyze.read", error)
    assert letter["reason"] == "corrupt_block" and letter["source"] == error.location


def test_a_damaged_sync_marker_is_reported_with_the_bytes_skipped() -> None:
    data = write_file(100, codec="null")
    blocks = list(records.read_avro_bytes(data))
    damaged = bytearray(data)
    damaged[blocks[1].offset + blocks[1].size - 1] ^= 0x01  # last byte of block 1's sync marker
    results = list(records.read_avro_bytes(bytes(damaged)))
    (error,) = [r for r in results if isinstance(r, records.ReadError)]
    # Where block 1 ends is no longer certain: the reader resumes after the next intact marker
    # (the end of block 2), reports the skipped byte range and an unknown number of lost records.
    assert error.position == blocks[1].offset and error.records_lost == -1
    assert f"bytes {blocks[1].offset}..{blocks[2].offset + blocks[2].size} skipped" in error.detail
    good = [r.offset for r in results if isinstance(r, records.AvroBlock)]
    assert good == [b.offset for b in blocks if b not in (blocks[1], blocks[2])]


def test_a_truncated_file_keeps_its_complete_blocks() -> None:
    data = write_file(100)
    blocks = list(records.read_avro_bytes(data))
    results = list(records.read_avro_bytes(data[: blocks[-1].offset + 5]))
    assert all(isinstance(r, records.AvroBlock) for r in results[:-1])
    assert isinstance(results[-1], records.ReadError)
    assert results[-1].reason == records.CORRUPT_BLOCK and results[-1].position == blocks[-1].offset


@pytest.mark.parametrize(
    "data", [b"", b"not avro at all", b"Obj\x01\x02", b"Obj\x02" + b"\x00" * 30], ids=repr
)
def test_an_unreadable_header_is_one_error(data: bytes) -> None:
    (error,) = list(records.read_avro_bytes(data))
    assert isinstance(error, records.ReadError)
    assert error.reason == records.UNREADABLE_FILE and error.position == 0


def test_a_missing_file_is_an_error_not_an_exception(tmp_path) -> None:
    (error,) = list(records.read_avro_blocks(tmp_path / "missing.avro"))
    assert error.reason == records.UNREADABLE_FILE


def test_files_on_disk_and_columns(tmp_path) -> None:
    path = tmp_path / "out.avro"
    records.write_avro(path, schemas.SHUFFLED_MESSAGE, [shuffled(i) for i in range(10)])
    (block,) = list(records.read_avro_blocks(path))
    columns = records.records_to_columns(block.records, ["payload_crc32c", "crowd_id"])
    assert columns["payload_crc32c"].dtype.kind == "i"
    assert columns["payload_crc32c"].tolist() == [shuffled(i)["payload_crc32c"] for i in range(10)]
    assert columns["crowd_id"].dtype == object
