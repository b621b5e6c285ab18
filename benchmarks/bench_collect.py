"""``esa collect`` under load on 127.0.0.1: accepted reports/s with 100 concurrent clients, p50
and p99 upload latency, the collector's CPU per 1,000 reports and its memory, then the
shuffler's read throughput of the collector's committed files in the same run.

One ``esa collect`` process (TLS, Ed25519-signed uploads, fsync before every answer) takes
uploads from the simulated fleet's client (``simulators/uploads.py``: aiohttp, 100 connections,
in this process) of 5 reports each from enrolled devices. CPU is the collector process's own
(``/proc/<pid>/stat``: user + system). After a SIGTERM (the open file committed) ``esa shuffle``
reads the files (``benchmarks/bench_shuffle.py``'s child, FnApiRunner, deletion on), beside the
raw fastavro read of the same files as baseline. The collector's RSS is sampled through the load:
its end against the most of its first half says whether memory stays flat.

Full mode: 2,000 devices x 10 uploads (100,000 reports); quick mode: 500 devices x 2 uploads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.bench_shuffle import _shuffle
from benchmarks.common import RAW_READ_SCRIPT, raw_read_note, run_child
from pipelines.run import start_collector
from schemas import REPORT, schema_json
from schemas.avro.container import encode_container
from schemas.crypto.device_keys import enrol_devices, load_credentials
from schemas.crypto.tls_certificates import make_collector_tls
from simulators.uploads import Upload, upload_all

REPORTS_PER_UPLOAD = 5
CONNECTIONS = 100
T0 = 1_700_006_400_000


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _body(rng: np.random.Generator, device: int) -> bytes:
    n = REPORTS_PER_UPLOAD
    columns = {
        "schema_version": 1,
        "shuffler_instance": 0,
        "channel": "bench",
        "recipe_id": "bench@1",
        "crowd_id": None,
        "min_crowd_size": 100,
        "origin": pa.array([f"claimed-{device}"] * n, pa.string()),
        "event_time": T0 + rng.integers(0, 86_400_000, n),
        "payload": pa.array([rng.bytes(96) for _ in range(n)], pa.binary()),
        "payload_crc32c": np.zeros(n, np.int64),
    }
    return encode_container(schema_json(REPORT), columns, n)


def run(quick: bool) -> list[dict]:
    devices, per_device = (500, 2) if quick else (2_000, 10)
    work = Path(tempfile.mkdtemp(prefix="bench-collect-"))
    try:
        enrol_devices(devices, work / "devices")
        make_collector_tls(work / "tls", ["127.0.0.1"])
        credentials = load_credentials(work / "devices")
        rng = np.random.default_rng(0)
        uploads = [
            Upload(0, credentials[d], f"bench-{d:06d}-{k:04d}", _body(rng, d), REPORTS_PER_UPLOAD)
            for k in range(per_device)
            for d in range(devices)
        ]
        output = work / "collected" / "instance=0"
        output.parent.mkdir()
        process, url = start_collector(0, output, work / "devices", work / "tls")
        samples: list[float] = []
        done = threading.Event()

        def sample() -> None:  # the collector's RSS every 0.25 s during the load
            while not done.wait(0.25):
                samples.append(_rss_mb(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            cpu_before = _cpu_seconds(process.pid)
            started = time.perf_counter()
            sampler.start()
            summary = asyncio.run(
                upload_all(uploads, [url], work / "tls" / "ca.crt", connections=CONNECTIONS)
            )
            seconds = time.perf_counter() - started
            cpu = _cpu_seconds(process.pid) - cpu_before
            done.set()
            sampler.join()
            samples.append(_rss_mb(process.pid))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        reports = summary.stored * REPORTS_PER_UPLOAD
        latencies = np.array(summary.latencies_s) * 1000
        paths = [str(p) for p in sorted(output.glob("*.avro"))]
        raw = run_child(RAW_READ_SCRIPT, paths)
        shuffled = _shuffle(str(output / "*.avro"), work / "shuffled")
        accept_rate = reports / seconds
        read_rate = shuffled["records"] / shuffled["seconds"]
        note = (
            f"{len(uploads):,} uploads of {REPORTS_PER_UPLOAD} reports from {devices:,} devices, "
            f"{CONNECTIONS} connections, TLS + Ed25519 + fsync per group; stored "
            f"{summary.stored:,}, failed {summary.failed}, retries {summary.retries}"
        )
        return [
            {
                "benchmark": "collect",
                "metric": "accepted_reports_per_s",
                "value": accept_rate,
                "baseline": read_rate,
                "ratio": accept_rate / read_rate,
                "note": "baseline: esa shuffle's read rate of the same files; " + note,
            },
            {
                "benchmark": "collect",
                "metric": "upload_p50_ms",
                "value": float(np.percentile(latencies, 50)),
                "note": note,
            },
            {
                "benchmark": "collect",
                "metric": "upload_p99_ms",
                "value": float(np.percentile(latencies, 99)),
                "note": note,
            },
            {
                "benchmark": "collect",
                "metric": "collector_cpu_s_per_1000_reports",
                "value": cpu / reports * 1000,
                "note": "user + system CPU of the esa collect process",
            },
            {
                "benchmark": "collect",
                "metric": "collector_rss_mb",
                "value": samples[-1],
                "baseline": max(samples[: max(1, len(samples) // 2)]),
                "ratio": samples[-1] / max(samples[: max(1, len(samples) // 2)]),
                "note": "VmRSS at the end of the load; baseline: the most in its first half "
                f"({len(samples)} samples over {seconds:.0f} s; flat: ratio near 1)",
            },
            {
                "benchmark": "collect",
                "metric": "shuffle_read_messages_per_s",
                "value": read_rate,
                "baseline": raw["records"] / raw["seconds"],
                "ratio": read_rate / (raw["records"] / raw["seconds"]),
                "note": f"esa shuffle of the collector's {len(paths)} committed files; "
                f"baseline: {raw_read_note(raw)}",
            },
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
