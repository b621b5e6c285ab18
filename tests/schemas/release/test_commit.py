"""Commit records and release verification (schemas/release/commit.py): every way a directory can lie
about its files. The crowd tables of esa-release/2 are tested in test_release_crowds.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from schemas.release import commit as rel
from tests import release_fixtures as fx

# Crowd "c" (8 messages in two groups) and the withheld crowd "small", both in bucket 0 of 1.
TABLE = "crowds/1704067200000-u0-b00000.avro"
PART0 = "messages/1704067200000-u0-b00000-g00000.avro"
PART1 = "messages/1704067200000-u0-b00000-g00001.avro"


def _release(directory: Path, signing_key=None) -> dict:
    payloads = [f"m{i}".encode() for i in range(8)]
    crowds = [fx.crowd("c", 4), fx.crowd("small", None)]
    return fx.write_release(
        directory, crowds, [payloads, []], buckets=1, groups=2, signing_key=signing_key
    )


def test_a_committed_release_verifies(tmp_path: Path) -> None:
    _release(tmp_path)
    verified = rel.verify_release(str(tmp_path))
    assert verified.records == 8 and len(verified.paths) == 3  # two message files, one table
    assert [entry.records for entry in verified.entries] == [2, 4, 4]
    assert verified.files == tuple(str(tmp_path / p) for p in (TABLE, PART0, PART1))
    commit = rel.read_commit(str(tmp_path))
    assert "crowds" not in commit and commit["parameters"]["crowd_buckets"] == 1
    assert (commit["crowds_released"], commit["crowds_withheld"]) == (1, 1)
    assert (commit["respondents_released"], commit["records_released"]) == (4, 8)
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


@pytest.mark.parametrize("name", [PART1, TABLE])
def test_missing_file(tmp_path: Path, name: str) -> None:
    _release(tmp_path)
    (tmp_path / name).unlink()
    _refused(tmp_path, name, "missing")


def test_extra_and_copied_files(tmp_path: Path) -> None:
    _release(tmp_path)
    shutil.copy(tmp_path / PART0, tmp_path / "messages" / "part-0 copy.avro")
    _refused(tmp_path, "part-0 copy.avro", "not listed")
    (tmp_path / "messages" / "part-0 copy.avro").unlink()
    (tmp_path / "notes.txt").write_text("x")
    _refused(tmp_path, "notes.txt", "not listed")


@pytest.mark.parametrize("name", [PART0, TABLE])
def test_truncated_altered_and_rewritten_files(tmp_path: Path, name: str) -> None:
    _release(tmp_path)
    path = tmp_path / name
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    _refused(tmp_path, name, "truncated")
    path.write_bytes(data + b"x")
    _refused(tmp_path, name, "grown")
    altered = bytearray(data)
    altered[-5] ^= 0x01
    path.write_bytes(bytes(altered))
    _refused(tmp_path, name, "SHA-256")
    path.write_bytes(data)
    rel.verify_release(str(tmp_path))


def _write(directory: Path, commit: dict) -> None:
    (directory / rel.COMMIT_FILE).write_text(json.dumps(commit))


def test_sha_and_record_count_mismatch_in_the_record(tmp_path: Path) -> None:
    record = _release(tmp_path)
    commit = rel.read_commit(str(tmp_path))
    commit["files"][1]["sha256"] = "0" * 64
    _write(tmp_path, commit)
    _refused(tmp_path, PART0, "SHA-256")
    commit["files"][1]["sha256"] = record["files"][1]["sha256"]
    commit["files"][1]["records"] = 5
    commit["records_released"] = 9
    _write(tmp_path, commit)
    _refused(tmp_path, PART0, "4 records, committed 5")
    commit["records_released"] = 8
    _write(tmp_path, commit)
    _refused(tmp_path, "records_released")
    commit["files"][1]["records"] = 4
    commit["files"][0]["records"] = 3  # the table's
    commit["crowds_withheld"] = 2
    _write(tmp_path, commit)
    _refused(tmp_path, TABLE, "2 records, committed 3")


@pytest.mark.parametrize(
    "name", ["dead_letter/part-0.avro", "manifest.avro", "metrics.json", "spill/x", "_spill-1/x"]
)
def test_private_files_inside_are_refused(tmp_path: Path, name: str) -> None:
    _release(tmp_path)
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b"origin=device-1")
    _refused(tmp_path, "shuffler-private")


def test_unreadable_commit_records_are_refused(tmp_path: Path) -> None:
    _release(tmp_path)
    (tmp_path / rel.COMMIT_FILE).write_text("[1, 2]")
    _refused(tmp_path, "not a commit record")
    (tmp_path / rel.COMMIT_FILE).write_text("{not json")
    _refused(tmp_path, "unreadable")


def test_the_older_format_is_refused_in_one_line(tmp_path: Path) -> None:
    _release(tmp_path)
    commit = rel.read_commit(str(tmp_path))
    commit["format"] = "esa-release/1"
    _write(tmp_path, commit)
    message = _refused(tmp_path, "'esa-release/1'", "older esa shuffle", "shuffle again")
    assert message.startswith(str(tmp_path / rel.COMMIT_FILE))
    with pytest.raises(ValueError, match="older esa shuffle"):
        rel.write_commit(str(tmp_path), commit)


def test_reports_format_is_generic(tmp_path: Path) -> None:
    rows = fx.message_rows(fx.crowd("c"), [b"a", b"b", b"c", b"d"])
    fx.write_avro(tmp_path / "instance=0" / "reports-0.avro", "shuffled_message", rows)
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
    commit["files"][1]["records"] = None
    _write(tmp_path, commit)
    _refused(tmp_path, "records")


def _field(name: str, value: object):
    def change(record: dict) -> None:
        record[name] = value

    return change


def _parameter(name: str, value: object):
    def change(record: dict) -> None:
        record["parameters"][name] = value

    return change


def _path(old: str, new: str):
    def change(record: dict) -> None:
        for entry in record["files"]:
            if entry["path"] == old:
                entry["path"] = new

    return change


FIELD_CASES = [
    ("no crowd_buckets", lambda r: r["parameters"].pop("crowd_buckets"), "crowd_buckets"),
    ("crowd_buckets 0", _parameter("crowd_buckets", 0), "crowd_buckets"),
    ("crowd_buckets 2^16 + 1", _parameter("crowd_buckets", 65537), "crowd_buckets"),
    ("crowd_buckets a string", _parameter("crowd_buckets", "1"), "crowd_buckets"),
    ("crowd_buckets true", _parameter("crowd_buckets", True), "crowd_buckets"),
    ("threshold 0", _parameter("crowd_threshold", 0), "crowd_threshold"),
    ("window_ms 0", _parameter("window_ms", 0), "window_ms"),
    ("instance 2^70", _field("instance", 2**70), "instance"),
    ("recipes a string", _field("recipes", "r@1"), "recipes"),
    ("a crowds list", _field("crowds", []), "lists no crowds"),
    ("crowds_released negative", _field("crowds_released", -1), "crowds_released"),
    ("respondents a float", _field("respondents_released", 4.0), "respondents_released"),
    ("no records_released", lambda r: r.pop("records_released"), "records_released"),
    ("records_released off", _field("records_released", 9), "message files' records"),
    ("crowd totals off", _field("crowds_withheld", 2), "crowd tables' records"),
    ("path of neither kind", _path(PART1, "messages/part-1.avro"), "neither"),
    ("bucket beyond B", _path(PART1, PART1.replace("b00000", "b00001")), "bucket"),
    ("instance of a path", _path(PART1, PART1.replace("-u0-", "-u1-")), "instance 0"),
]


@pytest.mark.parametrize(
    ("change", "words"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES]
)
def test_commit_fields_are_checked_when_written_and_read(
    tmp_path: Path, change, words: str
) -> None:
    _release(tmp_path)
    record = rel.read_commit(str(tmp_path))
    change(record)
    with pytest.raises(ValueError, match=words):  # write_commit refuses it, writing nothing
        rel.write_commit(str(tmp_path / "elsewhere"), record)
    assert not (tmp_path / "elsewhere").exists()
    _write(tmp_path, record)
    _refused(tmp_path, rel.COMMIT_FILE, words)


def test_records_are_counted_from_block_headers_as_fastavro_counts_them(tmp_path: Path) -> None:
    """count_avro_records seeks over the blocks' data; a file that is not whole blocks each
    followed by its sync marker is read block by block by fastavro, as before: the same count,
    or the same refusal."""
    import io

    import fastavro

    schema = fastavro.parse_schema(
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}
    )
    buffer = io.BytesIO()
    fastavro.writer(buffer, schema, [{"x": i} for i in range(5000)], "deflate", sync_interval=2000)
    good = buffer.getvalue()
    path = tmp_path / "f.avro"

    def fastavro_count(data: bytes) -> int:
        return sum(block.num_records for block in fastavro.block_reader(io.BytesIO(data)))

    path.write_bytes(good)
    assert rel.count_avro_records(str(path)) == fastavro_count(good) == 5000
    sync = good[-16:]
    second = good.index(
        sync, good.index(sync) + 16
    )  # the first block's marker (after the header's)
    damaged = good[:second] + bytes(16) + good[second + 16 :]
    path.write_bytes(damaged)
    with pytest.raises(ValueError, match="sync marker"):
        fastavro_count(damaged)
    with pytest.raises(ValueError, match="not a readable Avro file"):
        rel.count_avro_records(str(path))
    for cut in (len(good) - 5, len(good) // 2, 10):
        path.write_bytes(good[:cut])
        with pytest.raises(ValueError, match="not a readable Avro file"):
            rel.count_avro_records(str(path))
