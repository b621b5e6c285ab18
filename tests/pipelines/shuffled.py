"""Reading a shuffler's ``esa-release/2`` in the shuffler's tests: the verified files and the
crowd tables' records as the dicts a reader gets (one per crowd, in table order)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import fastavro

from schemas import release as rel
from transforms.shuffle_sinks import RELEASE_FORMAT


def verify(output: Any) -> rel.VerifiedRelease:
    """The release in ``output``, every file checked against its commit record."""
    return rel.verify_release(str(output), formats=(RELEASE_FORMAT,))


def _ms(value: Any) -> int:
    return round(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


def crowds(release: rel.VerifiedRelease) -> list[dict[str, Any]]:
    """Every committed crowd table's records, tables in path order."""
    found = []
    for path in release.files:
        if os.path.basename(os.path.dirname(path)) != "crowds":
            continue
        with open(path, "rb") as handle:
            for record in fastavro.reader(handle):
                found.append(_crowd(record))
    return found


def _crowd(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "window_start_ms": _ms(record["window_start"]),
        "window_end_ms": _ms(record["window_end"]),
        "instance": record["instance"],
        "channel": record["channel"],
        "recipe_id": record["recipe_id"],
        "crowd_id": record["crowd_id"],
        "status": record["status"],
        "respondents_released": record["respondents_released"],
        "messages_released": record["messages_released"],
    }
