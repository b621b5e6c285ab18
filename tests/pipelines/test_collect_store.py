"""The collector's durable files without a server: groups, rotation, commit records, recovery
from torn writes (what a power cut leaves and a SIGKILL cannot), dedupe memory on disk; and
its guards (skew, nonces, rate limit)."""

from __future__ import annotations

import json

import fastavro
import pytest

from pipelines.collector.guards import NonceMemory, RateLimiter, skewed
from pipelines.collector.store import (
    COMMIT_SUFFIX,
    STATE_DIR,
    Accepted,
    ReportStore,
    committed_files,
)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _upload(device: str, report_id: str, n: int, ms: int = 1_800_000_000_000) -> Accepted:
    records = [
        {
            "schema_version": 1,
            "shuffler_instance": 0,
            "channel": "c",
            "recipe_id": "c@1",
            "crowd_id": None,
            "min_crowd_size": 1,
            "origin": "claimed by the device",
            "event_time": 1_704_067_200_000,
            "payload": f"{device}/{report_id}/{i}".encode(),
            "payload_crc32c": 0,
        }
        for i in range(n)
    ]
    return Accepted(device, report_id, ms, f"device-{device}", records)


def _read(paths) -> list[dict]:
    out = []
    for path in paths:
        with open(path, "rb") as handle:
            out += list(fastavro.reader(handle))
    return out


def test_groups_rotate_into_committed_files_with_the_collectors_origin(tmp_path):
    clock = Clock()
    store = ReportStore(tmp_path, 0, rotate_bytes=10**9, rotate_age_s=5, clock=clock)
    store.append([_upload("a", "r1", 2), _upload("b", "r1", 1)])
    assert store.rotate_if_due() is None and not list(tmp_path.glob("*.avro"))
    clock.now += 6
    committed = store.rotate_if_due()
    assert committed is not None and committed_files(tmp_path) == [committed]
    record = json.loads(committed.with_name(committed.name + COMMIT_SUFFIX).read_text())
    assert (record["records"], record["uploads"], record["devices"]) == (3, 2, 2)
    records = _read([committed])
    assert {r["origin"] for r in records} == {"device-a", "device-b"}
    assert all(r["received_time"].timestamp() == 1_800_000_000 for r in records)
    store.append([_upload("a", "r2", 1)])
    assert store.close() is not None and len(committed_files(tmp_path)) == 2
    assert store.seen("a", "r1") and store.seen("a", "r2") and not store.seen("b", "r2")


def test_recovery_keeps_exactly_the_blocks_its_journal_vouches_for(tmp_path):
    store = ReportStore(tmp_path, 0, clock=Clock())
    store.append([_upload("a", "r1", 3)])
    store.append([_upload("b", "r1", 2)])
    state = tmp_path / STATE_DIR
    [open_file] = state.glob("*.avro.open")
    [journal] = state.glob("*.journal")
    good_size = open_file.stat().st_size
    # A power cut mid-group: half a block on disk, and a journal line for a block that never
    # reached the disk whole (its SHA-256 does not match).
    with open(open_file, "ab") as handle:
        handle.write(b"\x08\x40" + b"torn" * 10)
    lines = journal.read_text().splitlines()
    forged = json.loads(lines[-1]) | {"start": good_size, "end": good_size + 42, "sha256": "0" * 64}
    forged["uploads"] = [["c", "r1", 1_800_000_000_000, 1]]
    journal.write_text("\n".join([*lines, json.dumps(forged), '{"torn']) + "\n")
    del store  # the crashed process; its files stay as they are
    restarted = ReportStore(tmp_path, 0, clock=Clock())
    [committed] = committed_files(tmp_path)
    assert committed.stat().st_size == good_size
    records = _read([committed])
    assert sorted(r["origin"] for r in records) == ["device-a"] * 3 + ["device-b"] * 2
    assert restarted.seen("a", "r1") and restarted.seen("b", "r1")
    assert not restarted.seen("c", "r1")  # never stored: its retry must be stored
    assert not list(state.glob("*.open"))


def test_an_open_file_without_a_stored_upload_is_removed_on_restart(tmp_path):
    store = ReportStore(tmp_path, 0, clock=Clock())
    store.append([_upload("a", "r1", 1)])
    state = tmp_path / STATE_DIR
    [journal] = state.glob("*.journal")
    journal.write_text("")  # the journal line never reached the disk
    del store
    ReportStore(tmp_path, 0, clock=Clock())
    assert not list(tmp_path.glob("*.avro")) and not list(state.glob("*.open"))


def test_seen_ids_outlive_a_restart_within_the_window_only(tmp_path):
    clock = Clock()
    store = ReportStore(tmp_path, 0, dedupe_window_ms=60_000, clock=clock)
    store.append([_upload("a", "r1", 1, ms=int(clock.now * 1000))])
    store.close()
    assert ReportStore(tmp_path, 0, dedupe_window_ms=60_000, clock=clock).seen("a", "r1")
    clock.now += 61
    later = ReportStore(tmp_path, 0, dedupe_window_ms=60_000, clock=clock)
    assert not later.seen("a", "r1")
    assert len(committed_files(tmp_path)) == 1  # the data stays; only the id memory expires


def test_guards():
    assert skewed(0, 300_001, 300_000) and not skewed(0, 300_000, 300_000)
    nonces = NonceMemory(max_skew_ms=1000)
    assert nonces.first_use("a", "n1", 10_000, 10_000)
    assert not nonces.first_use("a", "n1", 10_000, 10_500)
    assert nonces.first_use("b", "n1", 10_000, 10_500)  # nonces are per device
    nonces.first_use("a", "n2", 20_000, 20_000)  # purges what is older than twice the skew
    assert len(nonces) == 1
    limiter = RateLimiter(rate=2.0, burst=2.0)
    assert limiter.take("a", 0.0) == 0.0 and limiter.take("a", 0.0) == 0.0
    wait = limiter.take("a", 0.0)
    assert wait == pytest.approx(0.5) and RateLimiter.retry_after(wait) == "1"
    assert limiter.take("b", 0.0) == 0.0  # another device has its own bucket
    assert limiter.take("a", 0.5) == 0.0
