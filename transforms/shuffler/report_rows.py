"""Pure, Beam-free row work of the ESA shuffler: validation, CRC32C, windows, origin hashes, grouping.

The Beam composite in ``transforms/shuffler/shuffle.py`` is a thin shell around these functions and the
release decisions of ``transforms/shuffler/decide.py``; each works on whole column batches (numpy
arrays, Arrow arrays) and is tested without a pipeline. Parameters (routes, rules, windows,
deletion) live in ``transforms/shuffler/params.py`` and are re-exported here.

* Every crowd is keyed by its recipe, so a crowd never mixes randomizers (amplification holds
  among reports of the same randomizer: amplification-by-shuffling, Section 4.1).
* An empty payload is a presence message (SPEC: one per device, crowd and instance): valid here,
  counted as a respondent and never released (``release_core.screen_origin_messages``).
* Origins are hashed with a secret per-run key before anything is spilled, so spill files never
  pair a plaintext origin with a payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from privacy.noise import RandomSource
from schemas.avro.columns import binary_buffers
from schemas.avro.crc32c import crc32c_many
from schemas.windows import MAX_EVENT_TIME_MS, MIN_EVENT_TIME_MS  # noqa: F401 - re-exported
from transforms.shuffler.params import (  # noqa: F401 - re-exported: the shuffler's parameters
    DeletionParameters,
    RecipeRoute,
    ValidationRules,
    WindowSpec,
    parse_duration_ms,
    routes_from_recipes,
)

# ---------------------------------------------------------------------------------------------
# Rejection reasons
# ---------------------------------------------------------------------------------------------

VALID = 0
# Reason codes in the order they are checked: a record gets the first reason that applies.
REASONS: tuple[str, ...] = (
    "",  # VALID
    "wrong_schema",
    "unknown_schema_version",
    "missing_field",
    "unknown_recipe",
    "recipe_channel_mismatch",
    "instance_out_of_range",
    "wrong_instance",
    "empty_origin",
    "event_time_out_of_range",
    "invalid_min_crowd_size",
    "crc_mismatch",
)
REASON_CODE: dict[str, int] = {name: code for code, name in enumerate(REASONS) if name}

# Reasons that do not come from validating one decoded record.
UNREADABLE_REASONS = ("unreadable_file", "corrupt_block")
LATE_DATA = "late_data"

# Report fields the shuffler needs, with the Arrow type groups each may have.
_INTEGER = "integer"
_STRING = "string"
_BINARY = "binary"
REPORT_FIELDS: dict[str, str] = {
    "schema_version": _INTEGER,
    "shuffler_instance": _INTEGER,
    "channel": _STRING,
    "recipe_id": _STRING,
    "crowd_id": _STRING,
    "min_crowd_size": _INTEGER,
    "origin": _STRING,
    "event_time": _INTEGER,
    "payload": _BINARY,
    "payload_crc32c": _INTEGER,
}
# Fields that may be null (a union with null in the schema); all others are required.
NULLABLE_FIELDS = frozenset({"crowd_id"})

_UINT32_MAX = 2**32 - 1


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _type_group(arrow_type: pa.DataType) -> str | None:
    if pa.types.is_integer(arrow_type):
        return _INTEGER
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return _STRING
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return _BINARY
    if pa.types.is_null(arrow_type):
        return "null"
    return None


def schema_problem(schema: pa.Schema) -> str | None:
    """Why a batch with this Arrow schema cannot hold Reports, or None if it can.

    A writer schema with extra fields is accepted (they are ignored); a missing field or a field
    of another type makes every record of the batch ``wrong_schema``.
    """
    for name, group in REPORT_FIELDS.items():
        index = schema.get_field_index(name)
        if index < 0:
            return f"field {name!r} is missing"
        found = _type_group(schema.field(index).type)
        # An all-null column of a nullable field has Arrow type null.
        if found != group and not (found == "null" and name in NULLABLE_FIELDS):
            return f"field {name!r} has type {schema.field(index).type}, expected {group}"
    return None


def latest_event_time_ms(window_ms: int | None) -> int:
    """The latest event time whose window (of ``window_ms``, aligned at 0) ends by
    MAX_EVENT_TIME_MS, the last instant every Avro timestamp-millis reader decodes (a window end
    of 10000-01-01 is written as a timestamp no reader can read)."""
    if not window_ms:
        return MAX_EVENT_TIME_MS
    return (MAX_EVENT_TIME_MS // window_ms) * window_ms - 1


def _int_column(batch: pa.RecordBatch, name: str, fill: int) -> np.ndarray:
    column = batch.column(name)
    return column.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def validate_reports(batch: pa.RecordBatch, rules: ValidationRules) -> np.ndarray:
    """One reason code per record (``VALID`` = 0, else an index into ``REASONS``).

    Checks, in order: schema (whole batch), schema version, required fields present, recipe known,
    recipe's channel equals the message's channel, 0 <= instance < the recipe's K, the run's own
    instance, non-empty origin, event time in range, min crowd size >= 0, CRC32C of the payload
    (an empty payload, a presence message, has CRC32C 0). DESIGN.md invariant 5: every rejected record is reported, none dropped.
    """
    rows = batch.num_rows
    reasons = np.zeros(rows, dtype=np.uint8)
    if rows == 0:
        return reasons
    if schema_problem(batch.schema) is not None:
        reasons[:] = REASON_CODE["wrong_schema"]
        return reasons

    def reject(mask: np.ndarray, reason: str) -> None:
        reasons[(reasons == VALID) & mask] = REASON_CODE[reason]

    version = _int_column(batch, "schema_version", -1)
    supported = np.array(sorted(rules.supported_versions), dtype=np.int64)
    reject(~np.isin(version, supported), "unknown_schema_version")

    missing = np.zeros(rows, dtype=bool)
    for name in REPORT_FIELDS:
        if name not in NULLABLE_FIELDS:
            missing |= batch.column(name).is_null().to_numpy(zero_copy_only=False)
    reject(missing, "missing_field")

    recipe_ids = rules.recipe_ids
    recipe_index = pc.index_in(batch.column("recipe_id"), value_set=pa.array(recipe_ids))
    recipe_index = recipe_index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    known = recipe_index >= 0
    reject(~known, "unknown_recipe")

    safe_index = np.where(known, recipe_index, 0)
    routes = [rules.routes[recipe_id] for recipe_id in recipe_ids]
    channels = sorted({route.channel for route in routes})
    recipe_channel = np.array([channels.index(route.channel) for route in routes], dtype=np.int64)
    message_channel = pc.index_in(batch.column("channel"), value_set=pa.array(channels))
    message_channel = message_channel.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    reject(known & (message_channel != recipe_channel[safe_index]), "recipe_channel_mismatch")

    instance = _int_column(batch, "shuffler_instance", -1)
    instances_of_recipe = np.array([route.shuffler_instances for route in routes], dtype=np.int64)
    reject((instance < 0) | (instance >= instances_of_recipe[safe_index]), "instance_out_of_range")
    if rules.instance is not None:
        reject(instance != rules.instance, "wrong_instance")

    origin_length = pc.binary_length(batch.column("origin")).fill_null(0)
    reject(origin_length.to_numpy(zero_copy_only=False) == 0, "empty_origin")

    event_time = _int_column(batch, "event_time", MIN_EVENT_TIME_MS)
    reject(
        (event_time < MIN_EVENT_TIME_MS) | (event_time > latest_event_time_ms(rules.window_ms)),
        "event_time_out_of_range",
    )

    reject(_int_column(batch, "min_crowd_size", 0) < 0, "invalid_min_crowd_size")

    declared = _int_column(batch, "payload_crc32c", -1)
    # Only payloads still in the running are checksummed (the CRC is the costly check).
    pending = np.flatnonzero(reasons == VALID)
    if pending.size:
        payloads = batch.column("payload")
        if pending.size < rows:
            payloads = payloads.take(pa.array(pending))
        computed = crc32c_many(payloads)
        mismatch = np.zeros(rows, dtype=bool)
        mismatch[pending] = (declared[pending] != computed) | (declared[pending] > _UINT32_MAX)
        reject(mismatch, "crc_mismatch")
    return reasons


def rejection_detail(reason: str, record: Mapping[str, Any], rules: ValidationRules) -> str:
    """A one-line human-readable explanation of why ``record`` got ``reason``."""
    recipe_id = record.get("recipe_id")
    route = rules.routes.get(recipe_id) if isinstance(recipe_id, str) else None
    if reason == "unknown_schema_version":
        return (
            f"schema_version {record.get('schema_version')!r} not in "
            f"{sorted(rules.supported_versions)}"
        )
    if reason == "missing_field":
        missing = [name for name in REPORT_FIELDS if record.get(name) is None]
        missing = [name for name in missing if name not in NULLABLE_FIELDS]
        return f"required field(s) {missing} are null"
    if reason == "unknown_recipe":
        return f"recipe {recipe_id!r} is not a known recipe"
    if reason == "recipe_channel_mismatch" and route is not None:
        return (
            f"recipe {recipe_id!r} belongs to channel {route.channel!r}, "
            f"message says {record.get('channel')!r}"
        )
    if reason == "instance_out_of_range" and route is not None:
        return (
            f"shuffler_instance {record.get('shuffler_instance')!r} not in "
            f"[0, {route.shuffler_instances}) of recipe {recipe_id!r}"
        )
    if reason == "wrong_instance":
        return (
            f"shuffler_instance {record.get('shuffler_instance')!r} is not this run's "
            f"instance {rules.instance}"
        )
    if reason == "empty_origin":
        return "origin is empty"
    if reason == "event_time_out_of_range":
        return (
            f"event_time {record.get('event_time')!r} not in "
            f"[{MIN_EVENT_TIME_MS}, {latest_event_time_ms(rules.window_ms)}] ms (its window "
            "must end by year 9999)"
        )
    if reason == "invalid_min_crowd_size":
        return f"min_crowd_size {record.get('min_crowd_size')!r} is negative"
    if reason == "crc_mismatch":
        payload = record.get("payload") or b""
        return (
            f"payload_crc32c {record.get('payload_crc32c')!r} != computed "
            f"{google_crc32c.value(payload)}"
        )
    return reason


# ---------------------------------------------------------------------------------------------
# Windows, crowds and origin shards
# ---------------------------------------------------------------------------------------------


def window_starts(event_time_ms: np.ndarray, spec: WindowSpec) -> np.ndarray:
    """Start (ms) of the fixed event-time window each event time falls in."""
    event_time_ms = np.asarray(event_time_ms, dtype=np.int64)
    return event_time_ms - np.mod(event_time_ms - spec.offset_ms, spec.period_ms)


# Positions of an origin string that get their own hash coefficient; longer origins wrap around.
ORIGIN_HASH_POSITIONS = 64


def new_origin_hash_key(source: RandomSource) -> np.ndarray:
    """A secret key for :func:`origin_hashes` (one per run): odd 64-bit multipliers."""
    words = np.frombuffer(source.random_bytes(8 * (ORIGIN_HASH_POSITIONS + 2)), dtype="<u8")
    return words.astype(np.uint64) | np.uint64(1)


def _fmix64(values: np.ndarray) -> np.ndarray:
    """The bijective 64-bit finalizer of MurmurHash3: spreads every input bit to the top bits."""
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(0xFF51AFD7ED558CCD)
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(0xC4CEB9FE1A85EC53)
    return values ^ (values >> np.uint64(33))


# Origins up to this long are hashed one byte position at a time for all origins at once;
# longer ones in one pass over all their bytes.
_HASH_BY_POSITION_MAX_LENGTH = 256


def origin_hashes(origins: pa.Array, key: np.ndarray) -> np.ndarray:
    """Keyed 64-bit hash of every origin string (uint64), vectorized over the string bytes.

    A multilinear hash sum_j (byte_j + 1) * key[j mod P] + length * key[P] (mod 2**64) with secret
    odd multipliers, then a bijective mixer. The key is secret per run, so senders cannot pick
    origins that pile into one shard. Shards only spread work: no released field or order
    depends on them.
    """
    if isinstance(origins, pa.ChunkedArray):
        origins = origins.combine_chunks()
    count = len(origins)
    if count == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets, data = binary_buffers(origins)
    lengths = np.diff(offsets)
    longest = int(lengths.max())
    if longest <= _HASH_BY_POSITION_MAX_LENGTH:
        # Longest first, so the origins still running at byte position j are a prefix.
        order = np.argsort((longest - lengths).astype(np.uint16), kind="stable")
        starts = offsets[:-1][order]
        running = count - np.cumsum(np.bincount(lengths, minlength=longest + 1))
        sums = np.zeros(count, dtype=np.uint64)
        for position in range(longest):
            active = int(running[position])
            byte_values = data[starts[:active] + position].astype(np.uint64) + np.uint64(1)
            sums[:active] += byte_values * key[position % ORIGIN_HASH_POSITIONS]
        unsorted = np.empty(count, dtype=np.uint64)
        unsorted[order] = sums
        sums = unsorted
    else:
        begin, end = int(offsets[0]), int(offsets[-1])
        byte_values = data[begin:end].astype(np.uint64) + np.uint64(1)
        position = np.arange(end - begin, dtype=np.int64) - np.repeat(offsets[:-1] - begin, lengths)
        contributions = byte_values * key[position % ORIGIN_HASH_POSITIONS]
        running_sum = np.concatenate(([np.uint64(0)], np.cumsum(contributions, dtype=np.uint64)))
        sums = running_sum[offsets[1:] - begin] - running_sum[offsets[:-1] - begin]
    sums = sums + lengths.astype(np.uint64) * key[ORIGIN_HASH_POSITIONS]
    return _fmix64(sums ^ key[ORIGIN_HASH_POSITIONS + 1])


def shard_row_range(sorted_hashes: np.ndarray, shard: int, bits: int) -> tuple[int, int]:
    """Rows [begin, end) of hash-sorted rows whose hash's top ``bits`` bits equal ``shard``."""
    if bits == 0:
        return 0, len(sorted_hashes)
    shift = 64 - bits
    low = np.uint64(shard << shift)
    begin = int(np.searchsorted(sorted_hashes, low, side="left"))
    if shard + 1 >= (1 << bits):
        return begin, len(sorted_hashes)
    high = np.uint64((shard + 1) << shift)
    return begin, int(np.searchsorted(sorted_hashes, high, side="left"))
