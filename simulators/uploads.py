"""The simulated fleet as a real network client: each device uploads its reports for each
shuffler instance to that instance's collector over HTTPS (``schemas/uploads.py``).

:func:`upload_jobs` turns a simulation's report files (``instance=<u>/reports-*.avro``) into one
upload per device and instance: the device's records, encoded once for the whole instance
(``schemas.avro.encode.encode_rows``) and sliced per device into an Avro container body. The
i-th distinct simulated origin (sorted) is the i-th enrolled credential
(``esa keys enrol``): a device signs every upload with its own key, whatever origin its records
claim. The report id is the SHA-256 of the device's records (the same upload always has the same
id, so a retry, or a rerun of the same simulation, is stored once).

:func:`upload_all` sends them with ``connections`` concurrent HTTPS connections (aiohttp), each
attempt freshly signed (new timestamp and nonce, same report id), retrying connection errors,
408, 429 and 5xx with exponential backoff (``Retry-After`` honoured) up to ``retries`` times.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import REPORT, schema_json
from schemas.avro.container import frame_block, header_bytes
from schemas.avro.encode import encode_rows
from schemas.avro.reader import ColumnBatch, read_container
from schemas.crypto.device_keys import DeviceCredential
from schemas.uploads import PATH, upload_headers

__all__ = ["Upload", "UploadSummary", "upload_jobs", "upload_all", "upload_files"]

RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True, repr=False)
class Upload:
    """One device's records for one instance, ready to send."""

    instance: int
    credential: DeviceCredential
    report_id: str
    body: bytes
    records: int


@dataclass
class UploadSummary:
    """What the fleet's uploads did (every upload ends stored, duplicate or failed)."""

    uploads: int = 0
    reports: int = 0
    stored: int = 0
    duplicates: int = 0
    attempts: int = 0
    retries: int = 0
    failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "uploads": self.uploads,
            "reports": self.reports,
            "stored": self.stored,
            "duplicates": self.duplicates,
            "attempts": self.attempts,
            "retries": self.retries,
            "failed": self.failed,
            "failures": dict(self.failures),
        }


def _read_instance(directory: Path) -> pa.Table | None:
    expect = schema_json(REPORT)
    batches = []
    for path in sorted(directory.glob("*.avro")):
        with open(path, "rb") as handle:
            for item in read_container(handle, str(path), 100_000, expect):
                if not isinstance(item, ColumnBatch):
                    raise ValueError(f"{path}: unreadable report file ({item.reason})")
                batches.append(item.columns)
    return pa.Table.from_batches(batches).combine_chunks() if batches else None


def upload_jobs(
    simulation: str | os.PathLike[str],
    instances: int,
    credentials: Sequence[DeviceCredential],
) -> list[Upload]:
    """One upload per (device, instance) from a simulation directory, instances interleaved."""
    folder = Path(simulation)
    tables = {u: _read_instance(folder / f"instance={u}") for u in range(instances)}
    origins = sorted(
        set().union(*(set(t.column("origin").unique().to_pylist()) for t in tables.values() if t))
    )
    if len(origins) > len(credentials):
        raise ValueError(
            f"{len(origins):,} simulated devices but only {len(credentials):,} enrolled "
            "credentials (esa keys enrol --devices N)"
        )
    device_of = {origin: index for index, origin in enumerate(origins)}
    schema = schema_json(REPORT)
    sync = os.urandom(16)
    header = header_bytes(schema, "null", sync)
    per_instance: list[list[Upload]] = []
    for instance, table in tables.items():
        if table is None or table.num_rows == 0:
            continue
        table = table.take(pc.sort_indices(table, [("origin", "ascending")]))
        origin_column = table.column("origin").combine_chunks()
        columns = {name: table.column(name).combine_chunks() for name in table.column_names}
        data, offsets = encode_rows(schema, columns, table.num_rows)
        values = np.asarray(origin_column.to_pylist(), dtype=object)
        starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
        bounds = np.r_[starts, table.num_rows]
        uploads = []
        for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            records = data[offsets[first] : offsets[last]].tobytes()
            credential = credentials[device_of[values[first]]]
            uploads.append(
                Upload(
                    instance=instance,
                    credential=credential,
                    report_id=hashlib.sha256(records).hexdigest()[:32],
                    body=header + frame_block(last - first, records, sync),
                    records=last - first,
                )
            )
        per_instance.append(uploads)
    interleaved = [u for group in zip_longest_lists(per_instance) for u in group]
    return interleaved


def zip_longest_lists(lists: list[list[Upload]]) -> list[list[Upload]]:
    longest = max((len(items) for items in lists), default=0)
    return [[items[i] for items in lists if i < len(items)] for i in range(longest)]


def client_tls_context(ca_file: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """Verify the collector's certificate against ``ca_file`` (esa keys tls: ``ca.crt``)."""
    context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def upload_all(
    uploads: Sequence[Upload],
    urls: Sequence[str],
    ca_file: str | os.PathLike[str] | None,
    connections: int = 16,
    retries: int = 8,
    timeout_s: float = 30.0,
    backoff_s: float = 0.05,
    clock: Any = time.time,
) -> UploadSummary:
    """Send every upload to ``urls[upload.instance]`` (see the module docstring)."""
    import aiohttp

    summary = UploadSummary(uploads=len(uploads), reports=sum(u.records for u in uploads))
    context = client_tls_context(ca_file)
    queue: asyncio.Queue[Upload] = asyncio.Queue()
    for upload in uploads:
        queue.put_nowait(upload)
    jitter = random.Random(0)

    async def send(session: Any, upload: Upload) -> None:
        url = urls[upload.instance].rstrip("/") + PATH
        for attempt in range(retries + 1):
            if attempt:
                summary.retries += 1
            summary.attempts += 1
            headers = upload_headers(
                upload.credential,
                upload.instance,
                upload.report_id,
                upload.body,
                int(clock() * 1000),
            )
            wait = backoff_s * (2**attempt) * (0.5 + jitter.random())
            started = time.perf_counter()
            try:
                async with session.post(url, data=upload.body, headers=headers) as response:
                    answer = await response.read()
                    status = response.status
                    retry_after = response.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                summary.failures[f"attempt:{type(error).__name__}"] += 1
                await asyncio.sleep(min(wait, 5.0))
                continue
            if status == 200:
                summary.latencies_s.append(time.perf_counter() - started)
                if b'"duplicate"' in answer:
                    summary.duplicates += 1
                else:
                    summary.stored += 1
                return
            summary.failures[f"attempt:{status}"] += 1
            if status not in RETRYABLE:
                break
            if retry_after and retry_after.isdigit():
                wait = max(wait, float(retry_after))
            await asyncio.sleep(min(wait, 5.0))
        summary.failed += 1

    async def worker(session: Any) -> None:
        while not queue.empty():
            upload = queue.get_nowait()
            await send(session, upload)

    connector = aiohttp.TCPConnector(limit=connections, ssl=context)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(connections)))
    return summary


def upload_files(
    simulation: str | os.PathLike[str],
    instances: int,
    urls: Sequence[str],
    credentials: Sequence[DeviceCredential],
    ca_file: str | os.PathLike[str] | None,
    connections: int = 16,
    retries: int = 8,
) -> UploadSummary:
    """:func:`upload_jobs` then :func:`upload_all`, on a fresh event loop."""
    if len(urls) != instances:
        raise ValueError(f"--collector needs one URL per shuffler instance ({instances})")
    jobs = upload_jobs(simulation, instances, credentials)
    return asyncio.run(upload_all(jobs, urls, ca_file, connections, retries))
