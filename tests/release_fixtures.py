"""Hand-built ``esa-release/2`` releases for tests (schemas/release/commit.py, schemas/release/crowd_buckets.py).

:func:`write_release` writes a valid release from crowd dicts (the keys of
``schemas.release.crowd_tables.CROWD_FIELDS``; ``instance`` and ``messages_released`` may be left out)
and each crowd's messages: real Avro message files in crowd buckets, real crowd tables and a
commit record written by ``schemas.release.commit.write_commit`` (signed when given a key).
:func:`recommit` re-states the committed files' sizes, records and SHA-256 after a test edited
them (so that what is tested is the content check, not the SHA-256), optionally changing the
record, and writes it without any check.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fastavro

from schemas import crc32c, parsed_schema
from schemas.crypto.commit_signing import sign_commit
from schemas.crypto.signing_keys import SigningKey
from schemas.release import commit
from schemas.release.crowd_buckets import (
    DEFAULT_CROWD_BUCKETS,
    BucketKey,
    crowd_bucket,
    crowd_order,
    crowd_table_path,
    message_file_path,
)
from schemas.release.crowd_tables import read_crowd_table

DAY_MS = 86_400_000
T0 = 1_704_067_200_000  # 2024-01-01
DEFAULT_PARAMETERS: dict[str, Any] = {
    "crowd_threshold": 2,
    "deletion_epsilon": None,
    "deletion_delta": None,
    "window": "1d",
    "window_ms": DAY_MS,
}
# Message columns of a crowd: payload bytes, or columns of ShuffledMessage fields (``payload``
# required; schema_version, payload_crc32c and the crowd's key columns default to the crowd's).
Messages = Sequence[bytes] | Mapping[str, Sequence[Any]]


def crowd(
    crowd_id: str | None = None,
    respondents: int | None = 10,
    *,
    start: int = T0,
    channel: str = "ch",
    recipe_id: str = "r@1",
    **more: Any,
) -> dict[str, Any]:
    """A crowd dict: released with ``respondents``, or withheld when ``respondents`` is None."""
    return {
        "window_start_ms": start,
        "window_end_ms": start + DAY_MS,
        "channel": channel,
        "recipe_id": recipe_id,
        "crowd_id": crowd_id,
        "status": "withheld" if respondents is None else "released",
        "respondents_released": respondents,
        **more,
    }


def message_rows(of: Mapping[str, Any], messages: Messages) -> list[dict[str, Any]]:
    """ShuffledMessage rows of crowd ``of`` from its message columns."""
    columns = {"payload": list(messages)} if not isinstance(messages, Mapping) else messages
    payloads = list(columns["payload"])
    rows = []
    for index, payload in enumerate(payloads):
        row = {
            "schema_version": 1,
            "window_start": of["window_start_ms"],
            "window_end": of["window_end_ms"],
            "channel": of["channel"],
            "recipe_id": of["recipe_id"],
            "crowd_id": of["crowd_id"],
            "payload": payload,
            "payload_crc32c": crc32c(payload),
        }
        row.update({name: values[index] for name, values in columns.items()})
        rows.append(row)
    return rows


def write_avro(path: Path, schema: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` as an Avro file of ``schemas/<schema>.avsc`` (parent directories made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        fastavro.writer(handle, parsed_schema(schema), list(rows), sync_interval=4096)


def table_rows(crowds: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """ReleasedCrowd rows of crowd dicts (in the given order)."""
    return [
        {
            "window_start": c["window_start_ms"],
            "window_end": c["window_end_ms"],
            "instance": c["instance"],
            "channel": c["channel"],
            "recipe_id": c["recipe_id"],
            "crowd_id": c["crowd_id"],
            "status": c["status"],
            "respondents_released": c["respondents_released"],
            "messages_released": c["messages_released"],
        }
        for c in crowds
    ]


def write_release(
    directory: str | Path,
    crowds: Sequence[Mapping[str, Any]],
    messages: Sequence[Messages] | None = None,
    instance: int | None = 0,
    parameters: Mapping[str, Any] | None = None,
    signing_key: SigningKey | None = None,
    buckets: int = DEFAULT_CROWD_BUCKETS,
    groups: int = 1,
) -> dict[str, Any]:
    """Write a valid ``esa-release/2`` release of ``crowds`` to ``directory``; returns its
    commit record. ``messages[i]``: crowd i's messages (none for a withheld crowd), spread over
    ``groups`` message files per bucket (message j to group j mod ``groups``)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    messages = list(messages) if messages is not None else [[] for _ in crowds]
    assert len(messages) == len(crowds), "one message column set per crowd"
    params = {**DEFAULT_PARAMETERS, **(parameters or {}), "crowd_buckets": buckets}
    stems: dict[BucketKey, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = defaultdict(list)
    for given, columns in zip(crowds, messages, strict=True):
        full = {"instance": instance, **given}
        rows = message_rows(full, columns)
        full.setdefault("messages_released", len(rows) if full["status"] == "released" else 0)
        bucket = crowd_bucket(full["channel"], full["recipe_id"], full["crowd_id"], buckets)
        stems[BucketKey(full["window_start_ms"], full["instance"], bucket)].append((full, rows))
    for key, members in stems.items():
        members.sort(
            key=lambda m: crowd_order(m[0]["channel"], m[0]["recipe_id"], m[0]["crowd_id"])
        )
        write_avro(
            root / crowd_table_path(key), "released_crowd", table_rows([m[0] for m in members])
        )
        for group in range(groups):
            rows = [row for _, crowd_rows in members for row in crowd_rows[group::groups]]
            if rows:
                write_avro(root / message_file_path(key, group), "shuffled_message", rows)
    paths = commit.release_files(str(root), ("messages", "crowds"))
    files = [commit.file_entry(str(root), path) for path in paths]
    every = [m[0] for members in stems.values() for m in members]
    released = [c for c in every if c["status"] == "released"]
    record = {
        "format": commit.RELEASE_FORMAT,
        "instance": instance,
        "recipes": sorted({c["recipe_id"] for c in every}),
        "parameters": params,
        "files": files,
        "records_released": sum(f["records"] for f in files if f["path"].startswith("messages/")),
        "crowds_released": len(released),
        "crowds_withheld": len(every) - len(released),
        "respondents_released": sum(c["respondents_released"] for c in released),
    }
    commit.write_commit(str(root), record, signing_key)
    return commit.read_commit(str(root))


def recommit(
    directory: str | Path,
    change: Callable[[dict[str, Any]], None] | None = None,
    signing_key: SigningKey | None = None,
    totals: bool = False,
) -> dict[str, Any]:
    """Re-state every messages/ and crowds/ file's entry in ``directory``'s commit record (and,
    with ``totals``, its totals from the files and crowd tables: a consistent lie), apply
    ``change``, sign with ``signing_key`` (or drop the signature) and write it unchecked."""
    root = Path(directory)
    record = commit.read_commit(str(root))
    record.pop("signature", None)
    paths = commit.release_files(str(root), ("messages", "crowds"))
    record["files"] = [_entry(root, path) for path in paths]
    if totals:
        crowds = [
            c for p in paths if p.startswith("crowds/") for c in read_crowd_table(str(root / p))
        ]
        released = [c for c in crowds if c["status"] == "released"]
        record.update(
            records_released=sum(
                f["records"] for f in record["files"] if f["path"].startswith("messages/")
            ),
            crowds_released=len(released),
            crowds_withheld=len(crowds) - len(released),
            respondents_released=sum(c["respondents_released"] for c in released),
        )
    if change is not None:
        change(record)
    if signing_key is not None:
        record = sign_commit(record, signing_key)
    (root / commit.COMMIT_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
    return record


def _entry(root: Path, path: str) -> dict[str, Any]:
    """A file's commit entry; an unreadable Avro file is stated as 0 records."""
    try:
        return commit.file_entry(str(root), path)
    except ValueError:
        return commit.file_entry(str(root), path, records=0)
