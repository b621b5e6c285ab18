"""Durable report files: what a 2xx from the collector promises.

Accepted uploads are appended in groups to one open Avro container file (the Report schema plus
the collector's ``received_time``, which resolves to ``schemas/report.avsc``: Avro 1.11
"Schema Resolution" ignores a writer field the reader lacks), one block per group:

1. the group's block is appended to ``DIR/.collector/<stem>.avro.open`` and a journal line
   (the block's offsets and SHA-256, each upload's device, report id, receive time and record
   count) to ``DIR/.collector/<stem>.journal``;
2. both files are ``fdatasync``-ed (at once, in two threads);
3. only then are the group's uploads answered 2xx.

A file rotates (:meth:`ReportStore.rotate_if_due`) when it holds ``rotate_bytes`` or has been
open ``rotate_age_s``: its commit record ``DIR/<stem>.avro.commit.json`` (format
``esa-collected/1``: size, records, SHA-256, uploads, devices, receive times) is written to a
temporary name, fsynced and renamed; then the data file is renamed to ``DIR/<stem>.avro`` and
both directories are fsynced. A file under ``DIR/*.avro`` is therefore always complete and
committed; the shuffler (``esa shuffle --input 'DIR/*.avro'``) never sees an open file.

Recovery (on start, after a crash or SIGKILL): the journal lines whose blocks are in the open
file byte for byte (offsets and SHA-256) are kept, up to the first that is not; the file is cut
back to the end of the last kept block (bytes after it were never acknowledged), the journal
rewritten to the kept lines, and the file committed and renamed; a file with no stored upload
is removed. An upload whose group reached the disk but whose answer did not reach the client is
stored, and the client's retry is answered ``duplicate``. Every acknowledged report is then in exactly one committed
file, and no unacknowledged one is remembered as seen, so a client's retry stores it once.

Deduplication: an upload is stored once per (device, report id) within ``dedupe_window_ms``
(default one day) of its receive time; the seen ids are the journals themselves, reloaded on
start, so a restart keeps them. Journals whose newest upload is older than the window are
deleted.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from schemas import REPORT, schema_json
from schemas.avro.columns import records_to_batch
from schemas.avro.container import compress, frame_block, header_bytes
from schemas.avro.encode import encode_rows
from schemas.avro.schema import strip_logical_types

__all__ = [
    "COLLECTED_FORMAT",
    "STATE_DIR",
    "Accepted",
    "ReportStore",
    "collected_schema",
    "committed_files",
]

COLLECTED_FORMAT = "esa-collected/1"
STATE_DIR = ".collector"
COMMIT_SUFFIX = ".commit.json"
_OPEN_SUFFIX = ".avro.open"
_JOURNAL_SUFFIX = ".journal"
_STEM = "reports-{instance}-{sequence:08d}"
log = logging.getLogger("esa.collect")


def collected_schema() -> dict[str, Any]:
    """The writer schema of collected files: Report (``schemas/report.avsc``) plus
    ``received_time``, when the collector received the upload (its own clock)."""
    schema = json.loads(json.dumps(schema_json(REPORT)))
    schema["fields"].append(
        {
            "name": "received_time",
            "type": {"type": "long", "logicalType": "timestamp-millis"},
            "doc": "When the collector received the upload (its clock); never released.",
        }
    )
    return schema


@dataclass
class Accepted:
    """One authenticated upload, ready to be stored: its Report records (as decoded; their
    ``origin`` is replaced by the collector's stamp ``origin`` when written)."""

    device: str
    report_id: str
    received_ms: int
    origin: str
    records: list[dict[str, Any]]


@dataclass
class _OpenFile:
    stem: str
    path: Path
    journal: Path
    handle: Any
    journal_handle: Any
    opened_at: float
    sync: bytes
    size: int
    digest: Any
    records: int = 0
    uploads: int = 0
    devices: set[str] = field(default_factory=set)
    first_ms: int | None = None
    last_ms: int | None = None


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _read_journal(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a journal (a torn last line, never acknowledged, is dropped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    entries = []
    for line in text.split("\n"):
        if not line:
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            break
    return entries


def _verified_entries(path: Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The journal's leading entries whose blocks are in the data file, byte for byte (a line
    synced before its block was is not stored, and was never acknowledged)."""
    kept = []
    with open(path, "rb") as handle:
        for entry in entries:
            expected = kept[-1]["end"] if kept else entry.get("start")
            if entry.get("start") != expected:
                break
            handle.seek(entry["start"])
            block = handle.read(entry["end"] - entry["start"])
            if hashlib.sha256(block).hexdigest() != entry.get("sha256"):
                break
            kept.append(entry)
    return kept


def _rewrite_journal(path: Path, entries: list[dict[str, Any]]) -> None:
    """The journal holding exactly ``entries`` (the deduplication memory of what is stored)."""
    _write_atomically(
        path, "".join(json.dumps(entry, separators=(",", ":")) + "\n" for entry in entries)
    )


def committed_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The data files in ``directory`` whose commit record is there and matches them (size and
    SHA-256): what a reader may trust."""
    folder = Path(directory)
    found = []
    for path in sorted(folder.glob("*.avro")):
        record_path = path.with_name(path.name + COMMIT_SUFFIX)
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("size") != path.stat().st_size:
            continue
        if record.get("sha256") != hashlib.sha256(path.read_bytes()).hexdigest():
            continue
        found.append(path)
    return found


class ReportStore:
    """The collector's files for one shuffler instance (see the module docstring). Not
    thread-safe: one writer calls :meth:`append`, :meth:`rotate_if_due` and :meth:`close`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        instance: int,
        rotate_bytes: int = 64 << 20,
        rotate_age_s: float = 60.0,
        dedupe_window_ms: int = 86_400_000,
        codec: str = "deflate",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.state = self.directory / STATE_DIR
        self.instance = instance
        self.rotate_bytes = rotate_bytes
        self.rotate_age_s = rotate_age_s
        self.dedupe_window_ms = dedupe_window_ms
        self.codec = codec
        self.clock = clock
        self.schema = collected_schema()
        self._report = strip_logical_types(schema_json(REPORT))
        self.committed = 0  # files committed by this process (recovered ones included)
        self._open: _OpenFile | None = None
        self._syncer = concurrent.futures.ThreadPoolExecutor(2, "esa-collect-sync")
        self._seen: dict[tuple[str, str], int] = {}
        self.state.mkdir(parents=True, exist_ok=True)
        self._sequence = self._last_sequence() + 1
        self._recover()
        self._load_seen()

    # -- deduplication -------------------------------------------------------------------------

    def seen(self, device: str, report_id: str) -> bool:
        return (device, report_id) in self._seen

    @property
    def seen_count(self) -> int:
        return len(self._seen)

    def forget_expired(self) -> int:
        """Drop seen ids older than the window from memory (their journals go on restart or
        rotation); returns how many."""
        cutoff = int(self.clock() * 1000) - self.dedupe_window_ms
        expired = [key for key, received in self._seen.items() if received < cutoff]
        for key in expired:
            del self._seen[key]
        return len(expired)

    # -- appending -----------------------------------------------------------------------------

    def append(self, uploads: Sequence[Accepted]) -> float:
        """Store ``uploads`` durably (one block, fdatasync, journal, fdatasync); returns the
        seconds the two syncs took. On an I/O error the open file is cut back to where it was
        and the error raised: none of the uploads is stored or remembered."""
        if not uploads:
            return 0.0
        current = self._open or self._open_new()
        records = [record for upload in uploads for record in upload.records]
        rows = len(records)
        counts = np.array([len(upload.records) for upload in uploads], dtype=np.int64)
        batch = records_to_batch(records, self._report)
        columns: dict[str, Any] = dict(zip(batch.schema.names, batch.columns, strict=True))
        columns["origin"] = pa.array(
            np.repeat(np.array([upload.origin for upload in uploads], dtype=object), counts),
            pa.string(),
        )
        columns["received_time"] = np.repeat(
            np.array([upload.received_ms for upload in uploads], dtype=np.int64), counts
        )
        data, _ = encode_rows(self.schema, columns, rows)
        block = frame_block(rows, compress(self.codec, data.tobytes(), 1), current.sync)
        entry = {
            "start": current.size,
            "end": current.size + len(block),
            "sha256": hashlib.sha256(block).hexdigest(),
            "uploads": [
                [upload.device, upload.report_id, upload.received_ms, len(upload.records)]
                for upload in uploads
            ],
        }
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        started = time.perf_counter()
        try:
            current.handle.write(block)
            current.handle.flush()
            current.journal_handle.write(line)
            current.journal_handle.flush()
            # Both synced at once: recovery keeps a journal line only if the block it names
            # is there with its SHA-256, so their order on disk does not matter.
            syncs = [
                self._syncer.submit(os.fdatasync, handle.fileno())
                for handle in (current.handle, current.journal_handle)
            ]
            for sync in syncs:
                sync.result()
        except OSError:
            self._cut_back(current)
            raise
        elapsed = time.perf_counter() - started
        current.size += len(block)
        current.digest.update(block)
        current.records += rows
        current.uploads += len(uploads)
        for upload in uploads:
            current.devices.add(upload.device)
            self._seen[(upload.device, upload.report_id)] = upload.received_ms
        first, last = min(u.received_ms for u in uploads), max(u.received_ms for u in uploads)
        current.first_ms = first if current.first_ms is None else min(current.first_ms, first)
        current.last_ms = last if current.last_ms is None else max(current.last_ms, last)
        return elapsed

    def _cut_back(self, current: _OpenFile) -> None:
        """After a failed group: both files back to their last acknowledged length."""
        journal_size = current.journal_handle.tell()
        for handle, size in ((current.handle, current.size), (current.journal_handle, None)):
            try:
                handle.flush()
            except OSError:
                pass
            try:
                if size is not None:
                    os.ftruncate(handle.fileno(), size)
                    handle.seek(size)
            except OSError:
                pass
        try:  # the journal line may be partly written: cut it back to its complete lines
            entries = _read_journal(current.journal)
            text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)
            if len(text.encode()) != journal_size:
                os.ftruncate(current.journal_handle.fileno(), len(text.encode()))
                current.journal_handle.seek(len(text.encode()))
        except OSError:
            pass

    def _open_new(self) -> _OpenFile:
        stem = _STEM.format(instance=self.instance, sequence=self._sequence)
        self._sequence += 1
        path = self.state / (stem + _OPEN_SUFFIX)
        journal = self.state / (stem + _JOURNAL_SUFFIX)
        sync = os.urandom(16)
        header = header_bytes(self.schema, self.codec, sync)
        handle = open(path, "xb")  # noqa: SIM115 - held open across groups, closed on commit
        handle.write(header)
        handle.flush()
        os.fsync(handle.fileno())
        journal_handle = open(journal, "xb")  # noqa: SIM115
        _fsync_directory(self.state)
        digest = hashlib.sha256(header)
        self._open = _OpenFile(
            stem, path, journal, handle, journal_handle, self.clock(), sync, len(header), digest
        )
        return self._open

    # -- rotation and commit -------------------------------------------------------------------

    def rotate_if_due(self) -> Path | None:
        """Commit the open file when it is big or old enough; returns the committed path."""
        current = self._open
        if current is None or current.records == 0:
            return None
        age = self.clock() - current.opened_at
        if current.size >= self.rotate_bytes or age >= self.rotate_age_s:
            return self._commit_open()
        return None

    def close(self) -> Path | None:
        """Commit the open file (graceful shutdown); an empty one is removed."""
        self._syncer.shutdown(wait=False)
        current = self._open
        if current is None:
            return None
        if current.records == 0:
            current.handle.close()
            current.journal_handle.close()
            current.path.unlink()
            current.journal.unlink()
            self._open = None
            return None
        return self._commit_open()

    def _commit_open(self) -> Path:
        current = self._open
        assert current is not None
        current.handle.close()
        current.journal_handle.close()
        self._open = None
        record = {
            "format": COLLECTED_FORMAT,
            "shuffler_instance": self.instance,
            "file": current.stem + ".avro",
            "size": current.size,
            "records": current.records,
            "sha256": current.digest.hexdigest(),
            "uploads": current.uploads,
            "devices": len(current.devices),
            "received_from_ms": current.first_ms,
            "received_until_ms": current.last_ms,
            "codec": self.codec,
        }
        return self._publish(current.stem, current.path, record)

    def _publish(self, stem: str, open_path: Path, record: dict[str, Any]) -> Path:
        """Commit record first, then the data file's rename, then both directories synced."""
        final = self.directory / (stem + ".avro")
        _write_atomically(final.with_name(final.name + COMMIT_SUFFIX), json.dumps(record) + "\n")
        os.replace(open_path, final)
        _fsync_directory(self.directory)
        _fsync_directory(self.state)
        self.committed += 1
        self._drop_old_journals()
        log.info(
            "committed %s: %d records, %d uploads, %d devices, %d bytes",
            final,
            record["records"],
            record["uploads"],
            record["devices"],
            record["size"],
        )
        return final

    # -- start-up ------------------------------------------------------------------------------

    def _last_sequence(self) -> int:
        prefix = f"reports-{self.instance}-"
        numbers = [0]
        for path in [*self.directory.iterdir(), *self.state.iterdir()]:
            name = path.name.lstrip(".")
            if name.startswith(prefix):
                digits = name[len(prefix) :].split(".")[0]
                if digits.isdigit():
                    numbers.append(int(digits))
        return max(numbers)

    def _recover(self) -> None:
        for open_path in sorted(self.state.glob("*" + _OPEN_SUFFIX)):
            stem = open_path.name[: -len(_OPEN_SUFFIX)]
            journal = self.state / (stem + _JOURNAL_SUFFIX)
            entries = _verified_entries(open_path, _read_journal(journal))
            acknowledged = [upload for entry in entries for upload in entry["uploads"]]
            if not acknowledged:
                open_path.unlink()
                journal.unlink(missing_ok=True)
                log.info("recovered %s: no stored upload, removed", open_path)
                continue
            end = entries[-1]["end"]
            with open(open_path, "r+b") as handle:
                handle.truncate(end)
                handle.flush()
                os.fsync(handle.fileno())
            _rewrite_journal(journal, entries)
            data = open_path.read_bytes()
            received = [upload[2] for upload in acknowledged]
            record = {
                "format": COLLECTED_FORMAT,
                "shuffler_instance": self.instance,
                "file": stem + ".avro",
                "size": len(data),
                "records": sum(upload[3] for upload in acknowledged),
                "sha256": hashlib.sha256(data).hexdigest(),
                "uploads": len(acknowledged),
                "devices": len({upload[0] for upload in acknowledged}),
                "received_from_ms": min(received),
                "received_until_ms": max(received),
                "codec": self.codec,
                "recovered": True,
            }
            log.info("recovered %s: cut to %d bytes of acknowledged uploads", open_path, end)
            self._publish(stem, open_path, record)

    def _journals(self) -> Iterable[Path]:
        return sorted(self.state.glob("*" + _JOURNAL_SUFFIX))

    def _load_seen(self) -> None:
        cutoff = int(self.clock() * 1000) - self.dedupe_window_ms
        for journal in self._journals():
            for entry in _read_journal(journal):
                for device, report_id, received_ms, _ in entry["uploads"]:
                    if received_ms >= cutoff:
                        self._seen[(device, report_id)] = received_ms

    def _drop_old_journals(self) -> None:
        """Delete the journals of committed files whose newest upload left the window."""
        cutoff = int(self.clock() * 1000) - self.dedupe_window_ms
        open_journal = self._open.journal if self._open else None
        for journal in self._journals():
            if journal == open_journal or (self.state / (journal.stem + _OPEN_SUFFIX)).exists():
                continue
            entries = _read_journal(journal)
            newest = max((upload[2] for entry in entries for upload in entry["uploads"]), default=0)
            if newest < cutoff:
                journal.unlink()
