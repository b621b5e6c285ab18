"""Commit records and release verification (schemas/release.py): every way a directory can lie."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import fastavro
import pytest

from schemas import parsed_schema
from schemas import release as rel


def _messages(count: int, crowd: str = "c") -> list[dict]:
    return [
        {
            "schema_version": 1,
            "window_start": 0,
            "window_end": 86_400_000,
            "channel": "ch",
            "recipe_id": "r@1",
            "crowd_id": crowd,
            "payload": f"m{i}".encode(),
            "payload_crc32c": 0,
        }
        for i in range(count)
    ]


def _release(directory: Path, counts: tuple[int, ...] = (5, 3)) -> dict:
    (directory / "messages").mkdir(parents=True)
    entries = []
    for index, count in enumerate(counts):
        relative = f"messages/part-{index}.avro"
        with open(directory / relative, "wb") as handle:
            fastavro.writer(
                handle, parsed_schema("shuffled_message"), _messages(count), sync_interval=64
            )
        entries.append(rel.file_entry(str(directory), relative))
    record = {
        "format": rel.RELEASE_FORMAT,
        "instance": 0,
        "recipes": ["r@1"],
        "parameters": {"crowd_threshold": 2, "deletion_epsilon": None, "deletion_delta": None},
        "crowds": [
            {
                "window_start_ms": 0,
                "window_end_ms": 86_400_000,
                "channel": "ch",
                "recipe_id": "r@1",
                "crowd_id": "c",
                "status": "released",
                "respondents_released": 4,
                "messages_released": sum(counts),
            },
            {
                "window_start_ms": 0,
                "window_end_ms": 86_400_000,
                "channel": "ch",
                "recipe_id": "r@1",
                "crowd_id": "small",
                "status": "withheld",
                "respondents_released": None,
                "messages_released": 0,
            },
        ],
        "files": entries,
        "records_released": sum(counts),
    }
    rel.write_commit(str(directory), record)
    return record


def test_a_committed_release_verifies(tmp_path: Path) -> None:
    _release(tmp_path)
    verified = rel.verify_release(str(tmp_path))
    assert verified.records == 8 and len(verified.paths) == 2
    assert [entry.records for entry in verified.entries] == [5, 3]
    assert verified.files == (
        str(tmp_path / "messages" / "part-0.avro"),
        str(tmp_path / "messages" / "part-1.avro"),
    )
    assert rel.read_commit(str(tmp_path))["crowds"][0]["respondents_released"] == 4
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write leaves no temporary file


def _refused(directory: Path, *words: str) -> str:
    with pytest.raises(rel.ReleaseError) as raised:
        rel.verify_release(str(directory))
    message = str(raised.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def test_uncommitted_directory_is_refused(tmp_path: Path) -> None:
    _release(tmp_path)
    (tmp_path / rel.COMMIT_FILE).unlink()
    _refused(tmp_path, "uncommitted")
    _refused(tmp_path / "nowhere", "not a directory")


def test_missing_file(tmp_path: Path) -> None:
    _release(tmp_path)
    (tmp_path / "messages" / "part-1.avro").unlink()
    _refused(tmp_path, "part-1.avro", "missing")


def test_extra_and_copied_files(tmp_path: Path) -> None:
    _release(tmp_path)
    shutil.copy(tmp_path / "messages" / "part-0.avro", tmp_path / "messages" / "part-0 copy.avro")
    _refused(tmp_path, "part-0 copy.avro", "not listed")
    (tmp_path / "messages" / "part-0 copy.avro").unlink()
    (tmp_path / "notes.txt").write_text("x")
    _refused(tmp_path, "notes.txt", "not listed")


def test_truncated_altered_and_rewritten_files(tmp_path: Path) -> None:
    _release(tmp_path)
    path = tmp_path / "messages" / "part-0.avro"
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    _refused(tmp_path, "part-0.avro", "truncated")
    altered = bytearray(data)
    altered[-5] ^= 0x01
    path.write_bytes(bytes(altered))
    _refused(tmp_path, "part-0.avro", "SHA-256")
    path.write_bytes(data)
    rel.verify_release(str(tmp_path))


def test_sha_and_record_count_mismatch_in_the_record(tmp_path: Path) -> None:
    record = _release(tmp_path)
    commit = rel.read_commit(str(tmp_path))
    commit["files"][0]["sha256"] = "0" * 64
    (tmp_path / rel.COMMIT_FILE).write_text(json.dumps(commit))
    _refused(tmp_path, "part-0.avro", "SHA-256")
    commit = rel.read_commit(str(tmp_path))
    commit["files"][0]["sha256"] = record["files"][0]["sha256"]
    commit["files"][0]["records"] = 6
    commit["records_released"] = 9
    commit["crowds"][0]["messages_released"] = 9
    (tmp_path / rel.COMMIT_FILE).write_text(json.dumps(commit))
    _refused(tmp_path, "part-0.avro", "5 records, committed 6")
    commit["records_released"] = 8
    (tmp_path / rel.COMMIT_FILE).write_text(json.dumps(commit))
    _refused(tmp_path, "records_released")


@pytest.mark.parametrize(
    "name", ["dead_letter/part-0.avro", "manifest.avro", "metrics.json", "spill/x", "_spill-1/x"]
)
def test_private_files_inside_are_refused(tmp_path: Path, name: str) -> None:
    _release(tmp_path)
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b"origin=device-1")
    _refused(tmp_path, "shuffler-private")


def test_commit_records_that_lie_about_crowds_are_refused(tmp_path: Path) -> None:
    _release(tmp_path)
    commit = rel.read_commit(str(tmp_path))
    commit["crowds"][1]["respondents_released"] = 7  # a withheld crowd may not state counts
    (tmp_path / rel.COMMIT_FILE).write_text(json.dumps(commit))
    _refused(tmp_path, "withheld")
    (tmp_path / rel.COMMIT_FILE).write_text("[1, 2]")
    _refused(tmp_path, "not a commit record")
    (tmp_path / rel.COMMIT_FILE).write_text("{not json")
    _refused(tmp_path, "unreadable")


def test_reports_format_is_generic(tmp_path: Path) -> None:
    (tmp_path / "instance=0").mkdir()
    with open(tmp_path / "instance=0" / "reports-0.avro", "wb") as handle:
        fastavro.writer(handle, parsed_schema("shuffled_message"), _messages(4))
    entry = rel.file_entry(str(tmp_path), "instance=0/reports-0.avro")
    rel.write_commit(str(tmp_path), {"format": rel.REPORTS_FORMAT, "files": [entry]})
    (tmp_path / "summary.json").write_text("{}")  # a file that holds no records
    summary = rel.file_entry(str(tmp_path), "summary.json")
    assert summary["records"] is None
    rel.write_commit(str(tmp_path), {"format": rel.REPORTS_FORMAT, "files": [entry, summary]})
    assert rel.verify_release(str(tmp_path), formats=(rel.REPORTS_FORMAT,)).records == 4
    assert rel.release_files(str(tmp_path), ("instance=0",)) == ["instance=0/reports-0.avro"]
    with pytest.raises(rel.ReleaseError, match="format"):  # not a shuffler release
        rel.verify_release(str(tmp_path), formats=(rel.RELEASE_FORMAT,))
    with pytest.raises(ValueError, match="twice"):
        rel.write_commit(str(tmp_path), {"format": rel.REPORTS_FORMAT, "files": [entry, entry]})


def test_an_avro_file_must_state_its_records(tmp_path: Path) -> None:
    _release(tmp_path)
    commit = rel.read_commit(str(tmp_path))
    commit["files"][0]["records"] = None
    (tmp_path / rel.COMMIT_FILE).write_text(json.dumps(commit))
    _refused(tmp_path, "records")
