"""Committed crowd counts must agree with the messages a release's files hold (issue #11).

A release's crowd tables (``esa-release/2``: ``crowds/<stem>.avro``, one per bucket of a window
and instance) state per crowd the messages it released (``messages_released``) and the
respondents (``respondents_released``, the analyzer's n). The files' SHA-256 checks say the files
are the committed ones, and ``schemas.release.commit.verify_release`` checks each table against its
stem and the totals; nothing there ties the per-crowd figures to the messages, so a table could
inflate n or relabel a crowd's recipe or channel. The analyzer's one pass over a release
(``pipelines.analyze.open_release``) goes stem by stem (one crowd table and its bucket's message
files at a time, so memory is bounded by the largest bucket, never by the number of crowds):
:func:`check_crowd_counts` reads the stem's message files
in Arrow column batches of the crowd-key columns, counts records per (window_start, window_end,
channel, recipe_id, crowd_id) and refuses (one line naming the release and the crowd) when a
crowd read is not released in the stem's table or its record count differs from
``messages_released`` (chaff and messages the analyzer will dead-letter count too: they were
released in that crowd). Records whose key cannot be read (unreadable chunks) are left to the
pipeline's accounting.

``respondents_released`` is not compared with the message count: presence messages are never
released, so a respondent may have sent no data message to one instance.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from pipelines.commandline.main import UsageError
from schemas.release import commit
from schemas.release.crowd_buckets import CROWDS_DIR, parse_release_path
from transforms.common import avro_io

__all__ = [
    "CrowdKey",
    "check_crowd_counts",
    "count_crowd_messages",
    "release_stems",
]

# (window_start_ms, window_end_ms, channel, recipe_id, crowd_id)
CrowdKey = tuple[int, int, str, str, str | None]
_KEY_COLUMNS = ("window_start", "window_end", "channel", "recipe_id", "crowd_id")


def _as_ms(column: pa.Array) -> list[int]:
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms")).cast(pa.int64())
    return column.to_pylist()


def count_crowd_messages(
    files: Sequence[str], batch_records: int = avro_io.DEFAULT_BATCH_RECORDS
) -> Counter[CrowdKey]:
    """Records per crowd key in ``files`` (unreadable chunks and batches lacking a key column are
    skipped: their records are the pipeline's dead letters)."""
    counts: Counter[CrowdKey] = Counter()
    for path in files:
        for item in avro_io.read_avro_batches(path, batch_records):
            if isinstance(item, avro_io.UnreadableChunk):
                continue
            batch = item.columns
            if any(name not in batch.schema.names for name in _KEY_COLUMNS):
                continue
            table = pa.table(
                {
                    "s": pa.array(_as_ms(batch.column("window_start")), pa.int64()),
                    "e": pa.array(_as_ms(batch.column("window_end")), pa.int64()),
                    "c": batch.column("channel"),
                    "r": batch.column("recipe_id"),
                    "k": batch.column("crowd_id"),
                }
            )
            grouped = table.group_by(["s", "e", "c", "r", "k"]).aggregate([([], "count_all")])
            for row in grouped.to_pylist():
                counts[(row["s"], row["e"], row["c"], row["r"], row["k"])] += row["count_all"]
    return counts


def _describe(key: CrowdKey) -> str:
    start, end, channel, recipe_id, crowd_id = key
    return json.dumps(
        {"window_start_ms": start, "window_end_ms": end, "channel": channel,
         "recipe_id": recipe_id, "crowd_id": crowd_id},
        ensure_ascii=False,
    )  # fmt: skip


def check_crowd_counts(
    path: str,
    crowds: Sequence[Mapping[str, Any]],
    files: Sequence[str],
    batch_records: int = avro_io.DEFAULT_BATCH_RECORDS,
) -> None:
    """UsageError (one line naming ``path`` and the crowd) unless every crowd read from
    ``files`` is released in ``crowds`` with ``messages_released`` equal to its record count, and
    every released crowd's count is what the files hold."""
    stated: dict[CrowdKey, int] = {}
    for crowd in crowds:
        key = (
            crowd.get("window_start_ms"),
            crowd.get("window_end_ms"),
            crowd.get("channel"),
            crowd.get("recipe_id"),
            crowd.get("crowd_id"),
        )
        stated[key] = (
            int(crowd.get("messages_released") or 0) if crowd.get("status") == "released" else -1
        )
    read = count_crowd_messages(files, batch_records)
    ordered = sorted(read.items(), key=lambda item: repr(item[0]))
    for key, count in ordered:  # first crowds not released at all (relabelled, removed)
        committed = stated.get(key)
        if committed is None or committed < 0:
            why = "not released" if committed is None else "withheld"
            raise UsageError(
                f"refusing release {path}: its files hold {count} messages of crowd "
                f"{_describe(key)}, which its commit record lists as {why}"
            )
    for key, count in ordered:
        if stated[key] != count:
            raise UsageError(
                f"refusing release {path}: crowd {_describe(key)} states messages_released "
                f"{stated[key]}, its files hold {count}"
            )
    for key, committed in stated.items():
        if committed > 0 and key not in read:
            raise UsageError(
                f"refusing release {path}: crowd {_describe(key)} states messages_released "
                f"{committed}, its files hold 0"
            )


def release_stems(verified: commit.VerifiedRelease) -> Iterator[tuple[str, list[str]]]:
    """``(crowd table, its stem's message files)`` of a verified ``esa-release/2`` release, table
    by table (paths joined as ``verified.files``; every message file's stem has a table)."""
    messages: dict[Any, list[str]] = {}
    tables: list[tuple[Any, str]] = []
    for entry, path in zip(verified.entries, verified.files, strict=True):
        parsed = parse_release_path(entry.path)
        if parsed is None:
            continue
        directory, key, _ = parsed
        if directory == CROWDS_DIR:
            tables.append((key, path))
        else:
            messages.setdefault(key, []).append(path)
    for key, table in tables:
        yield table, messages.get(key, [])
