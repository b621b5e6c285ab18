"""SIGKILL ``esa collect`` under load and restart it: every acknowledged report is in a committed
file exactly once, the clients' retries are stored once, and a reader that keeps reading the
visible files meanwhile never sees a file that is not whole and committed."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from pipelines.collector.store import COMMIT_SUFFIX, committed_files
from schemas import REPORT, schema_json
from schemas.avro.container import encode_container
from schemas.crypto.device_keys import origin_for
from simulators.uploads import Upload, upload_all
from tests.pipelines.collectors import Collector, free_port, make_keys

pytestmark = pytest.mark.slow

DEVICES = 300


def _body(index: int, records: int) -> bytes:
    columns = {
        "schema_version": 1,
        "shuffler_instance": 0,
        "channel": "load",
        "recipe_id": "load@1",
        "crowd_id": None,
        "min_crowd_size": 1,
        "origin": pa.array([f"claim-{index}"] * records, pa.string()),
        "event_time": np.full(records, 1_704_067_200_000, np.int64),
        "payload": pa.array([f"{index}:{r}".encode() for r in range(records)], pa.binary()),
        "payload_crc32c": np.zeros(records, np.int64),
    }
    return encode_container(schema_json(REPORT), columns, records)


def _read_whole(path) -> int:
    """Records of a visible file, which must be whole and match its commit record."""
    record = json.loads(path.with_name(path.name + COMMIT_SUFFIX).read_text())
    data = path.read_bytes()
    assert len(data) == record["size"], path
    with open(path, "rb") as handle:
        count = sum(1 for _ in fastavro.reader(handle))
    assert count == record["records"], path
    return count


def test_sigkill_under_load_and_restart_store_every_acknowledged_report_once(tmp_path):
    keys = make_keys(tmp_path, DEVICES)
    credentials = keys.credentials()
    port = free_port()
    output = tmp_path / "collected"
    flags = ("--rotate-bytes", "4096", "--rotate-age", "0.2", "--device-rate", "100")
    sizes = {origin_for(c.key_id): 1 + i % 4 for i, c in enumerate(credentials)}
    uploads = [
        Upload(0, c, f"load-{i:06d}", _body(i, 1 + i % 4), 1 + i % 4)
        for i, c in enumerate(credentials)
    ]
    server = Collector(keys, output, 0, port, *flags)
    outcome: dict = {}

    def client() -> None:
        outcome["summary"] = asyncio.run(
            upload_all(uploads, [server.url], keys.ca, connections=32, retries=60, backoff_s=0.02)
        )

    seen_problems: list[str] = []
    reading = threading.Event()

    def reader() -> None:  # reads every visible file again and again, as a shuffler would
        while not reading.is_set():
            for path in sorted(output.glob("*.avro")):
                try:
                    _read_whole(path)
                except FileNotFoundError:
                    continue
                except Exception as error:  # a half or uncommitted file would land here
                    seen_problems.append(f"{path.name}: {error!r}")
            time.sleep(0.01)

    uploader = threading.Thread(target=client)
    watcher = threading.Thread(target=reader)
    uploader.start()
    watcher.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            accepted = server.metrics()['esa_collector_uploads_accepted_total{instance="0"}']
            if accepted >= 40:
                break
            time.sleep(0.02)
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL  # mid-load, no goodbye
        time.sleep(0.3)
        server = Collector(keys, output, 0, port, *flags)
        uploader.join(300)
        assert not uploader.is_alive()
    finally:
        reading.set()
        watcher.join(30)
        assert server.stop() == 0
    summary = outcome["summary"]
    assert summary.failed == 0 and summary.stored + summary.duplicates == DEVICES
    assert summary.retries > 0  # the kill cut some uploads off
    assert not seen_problems, seen_problems[:3]
    files = sorted(output.glob("*.avro"))
    assert files == committed_files(output)
    assert not list((output / ".collector").glob("*.open"))
    counts: dict[str, int] = {}
    payloads: set[bytes] = set()
    for path in files:
        with open(path, "rb") as handle:
            for record in fastavro.reader(handle):
                counts[record["origin"]] = counts.get(record["origin"], 0) + 1
                assert record["payload"] not in payloads  # no report twice
                payloads.add(record["payload"])
    assert counts == sizes  # every device's reports, each exactly once
    assert sum(_read_whole(path) for path in files) == sum(sizes.values())
