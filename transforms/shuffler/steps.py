"""Pure parts of the shuffler's steps (no randomness, no pipeline): what each DoFn of
``transforms/shuffler/shuffle.py`` and ``transforms/shuffler/read.py`` computes from its rows.

Tested without a pipeline. ``count`` adds to a step's count dict and to the Beam counter of the
same name (``metrics.json`` sums the dicts; the counters are a cross-check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import SCHEMA_VERSION
from schemas.dead_letters import dead_letter
from schemas.release.crowd_buckets import BucketKey, crowd_buckets_of
from schemas.replays import repeated_sealed_payloads
from transforms.common import avro_io, counters, grouping
from transforms.shuffler import decide, report_rows, spill
from transforms.shuffler.config import METRICS_NAMESPACE, STAGE_VALIDATE
from transforms.shuffler.spill import CrowdKey, crowd_of_text, crowd_text


def count(counts: dict[str, int], name: str, value: int) -> None:
    """Add ``value`` to ``counts[name]`` and to the shuffler's Beam counter of that name."""
    counters.count(counts, METRICS_NAMESPACE, name, value)


# ---------------------------------------------------------------------------------------------
# Pure helpers of the steps (tested without a pipeline)
# ---------------------------------------------------------------------------------------------


def rejected_dead_letters(
    item: avro_io.ColumnBatch, reasons: np.ndarray, rules: report_rows.ValidationRules
) -> list[dict[str, Any]]:
    """Dead letters (with the original records) of the rows of a batch that failed validation."""
    rejected = np.flatnonzero(reasons != report_rows.VALID)
    if not rejected.size:
        return []
    problem = report_rows.schema_problem(item.columns.schema)
    records = item.columns.take(pa.array(rejected)).to_pylist()
    letters = []
    for row, record in zip(rejected.tolist(), records, strict=True):
        reason = report_rows.REASONS[reasons[row]]
        detail = problem if reason == "wrong_schema" and problem else None
        letters.append(
            dead_letter(
                STAGE_VALIDATE,
                reason,
                detail or report_rows.rejection_detail(reason, record, rules),
                f"{item.source}#record={item.first_record + row}",
                original_record=record,
            )
        )
    return letters


class BucketRows(NamedTuple):
    """Valid rows of one batch ready to spill: sorted by (bucket, origin hash), origin dropped,
    each row's crowd in the dictionary column ``crowd``."""

    rows: pa.RecordBatch  # REPORT_SPILL_SCHEMA
    keys: list[BucketKey]  # one per bucket, in row order
    starts: np.ndarray  # rows starts[i]:starts[i+1] belong to keys[i]


def bucket_rows(
    batch: pa.RecordBatch, window: report_rows.WindowSpec, hash_key: np.ndarray, buckets: int
) -> BucketRows:
    """Window, hash origins (secret key) and sort a batch of valid reports into spill rows by
    crowd bucket (``schemas.release.crowd_buckets``), the bucket computed once per DISTINCT crowd of the
    batch; ``record_index`` is the row's position in ``batch``."""
    window_start = report_rows.window_starts(
        batch.column("event_time").to_numpy(zero_copy_only=False), window
    )
    hashes = report_rows.origin_hashes(batch.column("origin"), hash_key)
    crowd_columns = [batch.column(name) for name in ("channel", "recipe_id", "crowd_id")]
    by_crowd, crowd_starts = grouping.group_rows(crowd_columns)
    first_rows = pa.array(by_crowd[crowd_starts[:-1]])
    crowds = list(
        zip(*(column.take(first_rows).to_pylist() for column in crowd_columns), strict=True)
    )
    texts = [crowd_text(*crowd) for crowd in crowds]
    bucket_of_crowd = crowd_buckets_of(crowds, buckets)
    crowd_of_row = np.empty(batch.num_rows, dtype=np.int32)
    crowd_of_row[by_crowd] = np.repeat(np.arange(len(texts), dtype=np.int32), np.diff(crowd_starts))
    bucket = np.asarray(bucket_of_crowd, dtype=np.int64)[crowd_of_row]
    key_columns = [pa.array(window_start), batch.column("shuffler_instance"), pa.array(bucket)]
    order, starts = grouping.group_rows_by_hash(key_columns, hashes)
    take = pa.array(order)
    crowds = pa.DictionaryArray.from_arrays(
        pa.array(crowd_of_row[order]), pa.array(texts, pa.string())
    )
    rows = pa.RecordBatch.from_arrays(
        [pa.array(hashes[order], type=pa.uint64())]
        + [
            batch.column(name).take(take).cast(spill.REPORT_SPILL_SCHEMA.field(name).type)
            for name in spill.SPILLED_REPORT_COLUMNS
        ]
        + [pa.array(order.astype(np.int64)), crowds],
        schema=spill.REPORT_SPILL_SCHEMA,
    )
    heads = order[starts[:-1]]
    instances = batch.column("shuffler_instance").take(pa.array(heads)).to_pylist()
    keys = [
        BucketKey(int(window_start[row]), int(instance), int(bucket[row]))
        for row, instance in zip(heads.tolist(), instances, strict=True)
    ]
    return BucketRows(rows, keys, starts)


def crowd_codes(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Each row's crowd as a code into the sorted list of the crowds present (key texts)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if len(column) == 0:
        return np.zeros(0, dtype=np.int64), []
    indices, present = spill.entries_in_use(column)
    used = np.flatnonzero(present)
    texts = column.dictionary.take(pa.array(used)).to_pylist()
    # Codes in the order of the texts, so that every shard lists its crowds the same way.
    by_text = np.argsort(np.asarray(texts, dtype=object), kind="stable")
    code_of_entry = np.zeros(present.size, dtype=np.int64)
    code_of_entry[used[by_text]] = np.arange(used.size)
    return code_of_entry[indices], [texts[index] for index in by_text.tolist()]


def spilled_dead_letters(
    key: Sequence[int],
    rows: pa.Table | pa.RecordBatch,
    sources: list[str] | str,
    stage: str,
    reason: str,
    detail: str | Callable[[str], str],
) -> list[dict[str, Any]]:
    """Dead letters for spilled report rows of the bucket ``key`` (window_start, instance, ...):
    each row's crowd from its ``crowd`` column; ``detail`` a text or a function of the crowd's
    key text. The spill holds no plaintext origin: the record gives ``origin_hash`` (hex) and
    ``source#record=N`` points to the full input record."""
    instance = int(key[1])
    letters = []
    for row in rows.to_pylist():
        source = sources if isinstance(sources, str) else sources[row[spill.PIECE_INDEX]]
        channel, recipe_id, crowd_id = crowd_of_text(row["crowd"])
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
                detail if isinstance(detail, str) else detail(row["crowd"]),
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


# A crowd's decision between Decide and CompleteBucket: one int64 row of a bucket's array (never
# a Python object per crowd across a grouping: runners that keep grouped values decoded in
# memory, FnApiRunner, would hold them all). ``outcome`` indexes OUTCOMES.
DRAFT_COLUMNS = ("respondents", "messages_in", "threshold", "respondents_kept", "outcome")
OUTCOMES = (
    (decide.RELEASED, None),
    (decide.WITHHELD, decide.BELOW_THRESHOLD),
    (decide.WITHHELD, decide.DELETION_ABORTED),
    (decide.WITHHELD, decide.BELOW_THRESHOLD_AFTER_DELETION),
)


def draft_row(decision: decide.CrowdDecision, messages_in: int) -> list[int]:
    """A crowd's decision and data messages as a row of :data:`DRAFT_COLUMNS`."""
    outcome = OUTCOMES.index((decision.status, decision.withheld_reason))
    return [
        decision.respondents,
        messages_in,
        decision.threshold,
        decision.respondents_kept,
        outcome,
    ]


def draft_decision(row: Sequence[int]) -> tuple[decide.CrowdDecision, int]:
    """``(decision, messages_in)`` of a :func:`draft_row`."""
    respondents, messages_in, threshold, kept, outcome = (int(value) for value in row)
    status, reason = OUTCOMES[outcome]
    return decide.CrowdDecision(respondents, threshold, status, reason, kept), messages_in


# The fields of a CrowdManifest in manifest_record's order. To its writer a manifest travels as
# the tuple of its values (manifest_row).
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


def origin_cap(rules: report_rows.ValidationRules, instance: int, recipe_id: str) -> int | None:
    """The per-origin data-message cap of a crowd of ``recipe_id`` on ``instance``."""
    route = rules.routes.get(recipe_id)
    return route.origin_cap(instance) if route is not None else None


class ScreenedRows(NamedTuple):
    """A shard's rows screened per crowd: a ``release_core`` code and a crowd code per row,
    the crowds' key texts (sorted) and their per-origin caps (-1: none); the distinct origins
    of each crowd (``respondents``) and each row's origin code in its crowd (``origins``, as
    :func:`origin_codes`; -1 on a repeated sealed payload, which counts nobody)."""

    codes: np.ndarray
    crowds: np.ndarray
    texts: list[str]
    caps: np.ndarray
    respondents: np.ndarray
    origins: np.ndarray


def screen(
    rows: pa.Table,
    rules: report_rows.ValidationRules,
    instance: int,
    repeated: np.ndarray | None = None,
) -> ScreenedRows:
    """Screen the rows of many crowds of one instance at once (caps by each crowd's recipe).

    Repeats of a sealed payload within a crowd are ``DUPLICATE_PAYLOAD`` first
    (``schemas.replays``: the earliest event time, then the row order, keeps its copy) and take
    no part in the other screening or in counting respondents. ``repeated``: those rows when
    the bucket spans several origin shards (``replays.shard_repeats``), else found here."""
    crowds, texts = crowd_codes(rows.column("crowd"))
    # One look-up per crowd of the shard, not per row.
    found = [origin_cap(rules, instance, crowd_of_text(text)[1]) for text in texts]
    caps = np.array([-1 if cap is None else cap for cap in found], dtype=np.int64)
    hashes = rows.column("origin_hash").to_numpy()
    presence = pc.binary_length(rows.column("payload")).to_numpy(zero_copy_only=False) == 0
    if repeated is None:
        order = rows.column("event_time").to_numpy() if "event_time" in rows.column_names else None
        repeated = repeated_sealed_payloads(crowds, rows.column("payload"), order)
    if not repeated.any():
        screened = decide.screen_crowd_messages_and_origins(
            crowds, hashes, presence, caps[crowds], len(texts)
        )
        return ScreenedRows(
            screened.codes, crowds, texts, caps, screened.distinct, screened.origins
        )
    codes = np.full(crowds.size, decide.DUPLICATE_PAYLOAD, dtype=np.uint8)
    origins = np.full(crowds.size, -1, dtype=np.int64)
    kept = ~repeated
    screened = decide.screen_crowd_messages_and_origins(
        crowds[kept], hashes[kept], presence[kept], caps[crowds[kept]], len(texts)
    )
    codes[kept] = screened.codes
    origins[kept] = screened.origins
    return ScreenedRows(codes, crowds, texts, caps, screened.distinct, origins)


def distinct_per_crowd(crowds: np.ndarray, hashes: np.ndarray, count: int) -> np.ndarray:
    """Distinct origin hashes of each of ``count`` crowds (rows carry crowd codes)."""
    return origin_codes(crowds, hashes, count)[0]


def origin_codes(
    crowds: np.ndarray, hashes: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, codes)``: the distinct origin hashes of each of ``count`` crowds, and each
    row's origin code in its crowd, in ``[0, distinct[crowd])``: the rank of its hash among the
    crowd's distinct hashes (what ``np.unique(..., return_inverse=True)`` of the crowd's rows
    gives, for all crowds in one sort)."""
    if not crowds.size:
        return np.zeros(count, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # By crowd, then hash (rows that tie are one origin: their order does not matter).
    order = np.argsort(hashes)
    order = order[decide.stable_order(crowds[order], count)]
    sorted_crowds, sorted_hashes = crowds[order], hashes[order]
    first = np.ones(crowds.size, dtype=bool)
    first[1:] = (sorted_crowds[1:] != sorted_crowds[:-1]) | (
        sorted_hashes[1:] != sorted_hashes[:-1]
    )
    return decide.number_origins(order, first, sorted_crowds, count)


def released_crowd(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The ReleasedCrowd record (``schemas/released_crowd.avsc``) of a crowd's manifest: a
    withheld crowd states no counts; a released one the distinct respondents and messages it
    released."""
    released = manifest["status"] == decide.RELEASED
    return {
        "window_start": int(manifest["window_start"]),
        "window_end": int(manifest["window_end"]),
        "instance": int(manifest["shuffler_instance"]),
        "channel": manifest["channel"],
        "recipe_id": manifest["recipe_id"],
        "crowd_id": manifest["crowd_id"],
        "status": "released" if released else "withheld",
        "respondents_released": (
            int(manifest["respondents"]) - int(manifest["respondents_deleted"])
            if released
            else None
        ),
        "messages_released": int(manifest["messages_released"]) if released else 0,
    }
