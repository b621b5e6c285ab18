"""Small report files for shuffler tests, written with fastavro (schemas/report.avsc)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import fastavro
import numpy as np

from schemas import SCHEMA_VERSION, crc32c, parsed_schema
from schemas.recipes import RECIPE_DIR
from transforms.shuffler.report_rows import RecipeRoute, ValidationRules

DAY_MS = 86_400_000
T0 = 1_700_006_400_000  # a window start (midnight UTC) for 1-day windows
RECIPE = "test@1"
OTHER_RECIPE = "other@1"  # same channel as RECIPE, a different randomizer
ALT_RECIPE = "alt@1"  # its own channel
CHANNEL = "test"
ALT_CHANNEL = "alt"

ROUTES = {
    RECIPE: RecipeRoute(CHANNEL, 2),
    OTHER_RECIPE: RecipeRoute(CHANNEL, 2),
    ALT_RECIPE: RecipeRoute(ALT_CHANNEL, 1),
}


def rules(instance: int | None = None) -> ValidationRules:
    return ValidationRules(
        routes=ROUTES, supported_versions=frozenset({SCHEMA_VERSION}), instance=instance
    )


def report(
    origin: str,
    payload: bytes = b"p",
    *,
    recipe_id: str = RECIPE,
    channel: str = CHANNEL,
    crowd_id: str | None = None,
    instance: int = 0,
    event_time: int = T0 + 1000,
    min_crowd_size: int = 1,
    schema_version: int = SCHEMA_VERSION,
    crc: int | None = None,
) -> dict[str, Any]:
    return {
        "schema_version": schema_version,
        "shuffler_instance": instance,
        "channel": channel,
        "recipe_id": recipe_id,
        "crowd_id": crowd_id,
        "min_crowd_size": min_crowd_size,
        "origin": origin,
        "event_time": event_time,
        "payload": payload,
        "payload_crc32c": crc32c(payload) if crc is None else crc,
    }


def crowd(
    respondents: int,
    messages_per_respondent: int = 1,
    *,
    prefix: str = "device",
    seed: int = 0,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Reports of ``respondents`` distinct origins; payloads are unique (origin, index) tags and
    event times spread over the first hour of the window, so tests can trace every message."""
    rng = np.random.default_rng(seed)
    times = fields.pop("event_time", None)
    records = []
    for respondent in range(respondents):
        for index in range(messages_per_respondent):
            origin = f"{prefix}-{respondent}"
            event_time = times if times is not None else T0 + int(rng.integers(0, 3_600_000))
            payload = f"{origin}/{index}".encode()
            records.append(report(origin, payload, event_time=event_time, **fields))
    return records


def report_bytes(
    records: Iterable[Mapping[str, Any]], codec: str = "null", sync_interval: int = 16000
) -> bytes:
    buffer = io.BytesIO()
    fastavro.writer(
        buffer, parsed_schema("report"), list(records), codec=codec, sync_interval=sync_interval
    )
    return buffer.getvalue()


def write_reports(
    path: str | Path,
    records: Iterable[Mapping[str, Any]],
    codec: str = "null",
    sync_interval: int = 16000,
) -> str:
    Path(path).write_bytes(report_bytes(records, codec, sync_interval))
    return str(path)


def shuffled_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        record["window_start"],
        record["channel"],
        record["recipe_id"],
        record["crowd_id"],
        record["payload"],
    )


def write_recipe(directory: Path, name: str, min_crowd_size: int) -> tuple[str, dict[str, str]]:
    """A shipped recipe (image_grid_onehot) renamed ``name``, with ``min_crowd_size``, written to
    ``directory/<name>.json``: its path, and the report fields (recipe_id, channel) that route
    reports to it."""
    body = json.loads((RECIPE_DIR / "image_grid_onehot.json").read_text())
    body.update(name=name, min_crowd_size=min_crowd_size)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(body))
    return str(path), {"recipe_id": f"{name}@{body['version']}", "channel": body["channel"]}


def cli_reports(folder: Path, recipe_name: str) -> tuple[str, str]:
    """A recipe file (a shipped recipe renamed, minimum crowd 5) and two report files using it
    under ``folder/reports``: 60 valid reports of one crowd, and 5 others (a crowd of 3, a
    wrong instance, a bad CRC). Returns the recipe path and the files' glob."""
    recipe, fields = write_recipe(folder, recipe_name, min_crowd_size=5)
    reports = folder / "reports"
    reports.mkdir()
    write_reports(reports / "a.avro", crowd(30, 2, **fields))
    write_reports(
        reports / "b.avro",
        crowd(3, 1, prefix="few", crowd_id="few", **fields)
        + [report("x", instance=4, **fields), report("y", crc=1, **fields)],
    )
    return recipe, str(reports / "*.avro")
