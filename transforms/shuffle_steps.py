"""Pure parts of the shuffler's steps (no randomness, no pipeline): what each DoFn of
``transforms/shuffle.py`` and ``transforms/shuffle_read.py`` computes from its rows.

Tested without a pipeline. ``count`` adds to a step's count dict and to the Beam counter of the
same name (``metrics.json`` sums the dicts; the counters are a cross-check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from schemas import SCHEMA_VERSION
from schemas.records import dead_letter
from transforms import avro_io
from transforms import release_core as decide
from transforms import shuffle_core as core
from transforms import shuffle_spill as spill
from transforms.shuffle_config import METRICS_NAMESPACE, STAGE_VALIDATE
from transforms.shuffle_spill import CrowdKey


def count(counts: dict[str, int], name: str, value: int) -> None:
    """Add ``value`` to ``counts[name]`` and to the Beam counter of that name."""
    if value:
        counts[name] = counts.get(name, 0) + int(value)
        Metrics.counter(METRICS_NAMESPACE, name.replace(":", "_")).inc(int(value))


# ---------------------------------------------------------------------------------------------
# Pure helpers of the steps (tested without a pipeline)
# ---------------------------------------------------------------------------------------------


def rejected_dead_letters(
    item: avro_io.ColumnBatch, reasons: np.ndarray, rules: core.ValidationRules
) -> list[dict[str, Any]]:
    """Dead letters (with the original records) of the rows of a batch that failed validation."""
    rejected = np.flatnonzero(reasons != core.VALID)
    if not rejected.size:
        return []
    problem = core.schema_problem(item.columns.schema)
    records = item.columns.take(pa.array(rejected)).to_pylist()
    letters = []
    for row, record in zip(rejected.tolist(), records, strict=True):
        reason = core.REASONS[reasons[row]]
        detail = problem if reason == "wrong_schema" and problem else None
        letters.append(
            dead_letter(
                STAGE_VALIDATE,
                reason,
                detail or core.rejection_detail(reason, record, rules),
                f"{item.source}#record={item.first_record + row}",
                original_record=record,
            )
        )
    return letters


class KeyedRows(NamedTuple):
    """Valid rows of one batch ready to spill: sorted by (crowd, origin hash), origin dropped."""

    rows: pa.RecordBatch  # REPORT_SPILL_SCHEMA
    keys: list[CrowdKey]  # one per crowd, in row order
    starts: np.ndarray  # rows starts[i]:starts[i+1] belong to keys[i]


def key_rows(
    batch: pa.RecordBatch, first_record: int, window: core.WindowSpec, hash_key: np.ndarray
) -> KeyedRows:
    """Window, hash origins (secret key) and sort a batch of valid reports into spill rows."""
    window_start = core.window_starts(
        batch.column("event_time").to_numpy(zero_copy_only=False), window
    )
    hashes = core.origin_hashes(batch.column("origin"), hash_key)
    key_columns = [
        pa.array(window_start),
        batch.column("shuffler_instance"),
        batch.column("channel"),
        batch.column("recipe_id"),
        batch.column("crowd_id"),
    ]
    order, starts = core.group_rows_by_hash(key_columns, hashes)
    take = pa.array(order)
    rows = pa.RecordBatch.from_arrays(
        [pa.array(hashes[order], type=pa.uint64())]
        + [
            batch.column(name).take(take).cast(spill.REPORT_SPILL_SCHEMA.field(name).type)
            for name in spill.SPILLED_REPORT_COLUMNS
        ]
        + [pa.array(order.astype(np.int64) + first_record)],
        schema=spill.REPORT_SPILL_SCHEMA,
    )
    first_rows = order[starts[:-1]]
    columns = [
        batch.column(name).take(pa.array(first_rows)).to_pylist()
        for name in ("shuffler_instance", "channel", "recipe_id", "crowd_id")
    ]
    keys = [
        (int(window_start[row]), int(instance), channel, recipe, crowd)
        for row, instance, channel, recipe, crowd in zip(first_rows.tolist(), *columns, strict=True)
    ]
    return KeyedRows(rows, keys, starts)


def spilled_dead_letters(
    key: CrowdKey,
    rows: pa.Table | pa.RecordBatch,
    sources: list[str] | str,
    stage: str,
    reason: str,
    detail: str,
) -> list[dict[str, Any]]:
    """Dead letters for spilled report rows. The spill holds no plaintext origin: the record
    gives ``origin_hash`` (hex) and ``source#record=N`` points to the full input record."""
    window_start, instance, channel, recipe_id, crowd_id = key
    letters = []
    for row in rows.to_pylist():
        source = sources if isinstance(sources, str) else sources[row[spill.PIECE_INDEX]]
        record = {
            "schema_version": SCHEMA_VERSION,
            "shuffler_instance": instance,
            "channel": channel,
            "recipe_id": recipe_id,
            "crowd_id": crowd_id,
            "min_crowd_size": row["min_crowd_size"],
            "origin_hash": f"{row['origin_hash']:016x}",
            "event_time": row["event_time"],
            "payload": row["payload"],
            "payload_crc32c": row["payload_crc32c"],
        }
        letters.append(
            dead_letter(
                stage,
                reason,
                detail,
                f"{source}#record={row['record_index']}",
                original_record=record,
            )
        )
    return letters


def manifest_record(
    key: CrowdKey,
    window_end: int,
    decision: decide.CrowdDecision,
    messages_in: int,
    messages_deleted: int,
    messages_released: int,
) -> dict[str, Any]:
    """A CrowdManifest (``schemas/manifest.avsc``) for one crowd (shuffler-private)."""
    window_start, instance, channel, recipe_id, crowd_id = key
    return {
        "window_start": window_start,
        "window_end": window_end,
        "shuffler_instance": instance,
        "channel": channel,
        "recipe_id": recipe_id,
        "crowd_id": crowd_id,
        "respondents": decision.respondents,
        "messages_in": messages_in,
        "threshold": decision.threshold,
        "status": decision.status,
        "withheld_reason": decision.withheld_reason,
        "respondents_deleted": decision.respondents_deleted,
        "messages_deleted": messages_deleted,
        "messages_released": messages_released,
    }


# The fields of a CrowdManifest in manifest_record's order. Between steps a manifest travels as
# the tuple of its values (manifest_row): a dict per crowd, decoded and held by runners that keep
# grouped values in memory (FnApiRunner), costs several times the tuple.
MANIFEST_FIELDS = (
    "window_start", "window_end", "shuffler_instance", "channel", "recipe_id", "crowd_id",
    "respondents", "messages_in", "threshold", "status", "withheld_reason",
    "respondents_deleted", "messages_deleted", "messages_released",
)  # fmt: skip


def manifest_row(record: Mapping[str, Any]) -> tuple:
    """A manifest's values in :data:`MANIFEST_FIELDS` order (a dict passes through converted)."""
    return tuple(record[name] for name in MANIFEST_FIELDS)


def manifest_dict(row: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
    """The CrowdManifest dict of a :func:`manifest_row` (or a copy of a dict)."""
    if isinstance(row, Mapping):
        return dict(row)
    return dict(zip(MANIFEST_FIELDS, row, strict=True))


def origin_cap(rules: core.ValidationRules, key: CrowdKey) -> int | None:
    route = rules.routes.get(key[3])
    return route.origin_cap(key[1]) if route is not None else None


def screen(rows: pa.Table, rules: core.ValidationRules, key: CrowdKey) -> np.ndarray:
    hashes = rows.column("origin_hash").to_numpy()
    presence = pc.binary_length(rows.column("payload")).to_numpy(zero_copy_only=False) == 0
    return decide.screen_origin_messages(hashes, presence, origin_cap(rules, key))
