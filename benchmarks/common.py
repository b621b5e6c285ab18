"""Shared pieces of the pipeline benchmarks: child processes, their peak memory, and the raw read.

Each measured step runs in a fresh interpreter (:func:`run_child`) so that its peak memory is its
own: ``VmHWM``, the high-water RSS of the child's address space (:func:`peak_rss_mb`);
``getrusage``'s ``ru_maxrss`` would also count the parent's pages the child held between fork and
exec.

The baseline the pipelines are compared with is the fastest plain fastavro read of the same files,
``for record in fastavro.reader(f)`` with logical types left as ints (:func:`raw_read`). fastavro's
default read turns every ``timestamp-millis`` into a ``datetime``, about a third of its time, which
the pipelines never do. Two ways are timed, file by file in turn, and the faster one is the
baseline: the file's header with the schema's ``logicalType`` keys removed (what the pipelines'
reader decodes), and fastavro's ``timestamp-millis`` reader unregistered. (Passing a reader schema
without ``logicalType`` is slower still: fastavro then resolves schemas per record.) The default
read is timed on the first file for reference.

This module imports only the standard library and fastavro, so that importing it does not add to a
child's memory.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import fastavro
from fastavro import logical_readers
from fastavro.read import HEADER_SCHEMA

REPOSITORY = Path(__file__).resolve().parents[1]

# The child script of :func:`raw_read`: paths as JSON in argv[1], the result as JSON on stdout.
RAW_READ_SCRIPT = """
import json, sys
from benchmarks.common import raw_read
print(json.dumps(raw_read(json.loads(sys.argv[1]))))
"""


def peak_rss_mb(pid: int | None = None) -> float:
    """Peak resident memory in MB (``VmHWM``) of process ``pid``, by default this one (where
    ``/proc`` is absent: this process's ``ru_maxrss``; another process's: NaN)."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    if pid is not None:
        return float("nan")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def best_seconds(function: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` runs (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def run_child(script: str, argument: Any) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter with ``argument`` as JSON in ``argv[1]``; the JSON
    object on the last line of its output (with its own peak RSS in MB)."""
    process = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argument)],
        capture_output=True,
        cwd=str(REPOSITORY),
        check=False,
    )
    if process.returncode != 0:
        tail = process.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"benchmark child failed ({process.returncode}): {tail}")
    return json.loads(process.stdout.decode().strip().splitlines()[-1])


def _strip_logical_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical_types(item) for item in schema]
    return schema


class _Prefixed(io.RawIOBase):
    """A new header, then the rest of the file (streamed)."""

    def __init__(self, prefix: bytes, handle: BinaryIO) -> None:
        self.prefix, self.handle = prefix, handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.prefix[: len(buffer)] if self.prefix else self.handle.read(len(buffer))
        self.prefix = self.prefix[len(data) :]
        buffer[: len(data)] = data
        return len(data)


def _without_logical_types(handle: BinaryIO) -> BinaryIO:
    header = fastavro.schemaless_reader(handle, HEADER_SCHEMA)
    meta = dict(header["meta"])
    meta["avro.schema"] = json.dumps(_strip_logical_types(json.loads(meta["avro.schema"]))).encode()
    prefix = io.BytesIO()
    fastavro.schemaless_writer(prefix, HEADER_SCHEMA, {**header, "meta": meta})
    return io.BufferedReader(_Prefixed(prefix.getvalue(), handle), 1 << 20)


def _count(records: Iterator[dict[str, Any]]) -> tuple[int, bool]:
    """How many records, and whether the last one holds a ``datetime``."""
    count, record = 0, {}
    for record in records:  # noqa: B007 - the last record is looked at below
        count += 1
    return count, any(isinstance(value, dt.datetime) for value in record.values())


def _read_stripped_header(path: str) -> tuple[int, bool]:
    with open(path, "rb") as handle:
        return _count(fastavro.reader(_without_logical_types(handle)))


def _read_without_timestamp_reader(path: str) -> tuple[int, bool]:
    saved = logical_readers.LOGICAL_READERS.pop("long-timestamp-millis")
    try:
        with open(path, "rb") as handle:
            return _count(fastavro.reader(handle))
    finally:
        logical_readers.LOGICAL_READERS["long-timestamp-millis"] = saved


def _read_default(path: str) -> tuple[int, bool]:
    with open(path, "rb") as handle:
        return _count(fastavro.reader(handle))


def raw_read(paths: list[str]) -> dict[str, Any]:
    """Time the plain fastavro reads of ``paths`` (see the module docstring).

    Returns ``seconds`` and ``records`` of the faster way, its name (``way``), the ``rates`` of
    both ways, the default read's ``default_rate`` on the first file, and ``peak_rss_mb``.
    """
    ways: dict[str, Callable[[str], tuple[int, bool]]] = {
        "stripped_header": _read_stripped_header,
        "no_timestamp_reader": _read_without_timestamp_reader,
    }
    seconds = dict.fromkeys(ways, 0.0)
    records = dict.fromkeys(ways, 0)
    for path in paths:
        for name, read in ways.items():
            start = time.perf_counter()
            count, has_datetimes = read(path)
            seconds[name] += time.perf_counter() - start
            records[name] += count
            if has_datetimes:
                raise RuntimeError(f"raw read {name} converted timestamps to datetime")
    best = min(seconds, key=seconds.__getitem__)
    start = time.perf_counter()
    default_records = _read_default(paths[0])[0]
    default_seconds = time.perf_counter() - start
    return {
        "seconds": seconds[best],
        "records": records[best],
        "way": best,
        "rates": {name: records[name] / seconds[name] for name in ways},
        "default_rate": default_records / default_seconds,
        "peak_rss_mb": peak_rss_mb(),
    }


def raw_read_rates(raw: dict[str, Any]) -> str:
    """The rates of :func:`raw_read`'s ways, for a row's note."""
    return ", ".join(f"{name} {rate:,.0f}/s" for name, rate in sorted(raw["rates"].items()))


def raw_read_note(raw: dict[str, Any]) -> str:
    """What :func:`raw_read`'s baseline is, for a row's note."""
    return (
        f"fastest plain fastavro read of the same files, logical types as ints ({raw['way']}; "
        f"rates {raw_read_rates(raw)}); fastavro's default read with datetime conversion (first "
        f"file): {raw['default_rate']:,.0f}/s"
    )
