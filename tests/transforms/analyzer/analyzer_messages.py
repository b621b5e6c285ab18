"""Recipes, shuffled-message batches and commit-record crowds for the analyzer's pure tests."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from privacy.randomizers import build_randomizer
from schemas import crc32c
from schemas.payloads import CENSUS, encode_payloads
from schemas.recipes import Recipe, recipe_from_dict
from transforms.analyzer.arithmetic import MESSAGE_COLUMNS, RecipeBook

DAY = 86_400_000
T0 = 1_704_067_200_000  # 2024-01-01


def recipe_of(name: str, randomizer: str, params: dict, **extra) -> Recipe:
    built = build_randomizer(randomizer, params)
    data = {
        "name": name,
        "version": 1,
        "channel": extra.pop("channel", name),
        "randomizer": randomizer,
        "randomizer_params": params,
        "fragmentation": "attribute",
        "epsilon_local": None if math.isinf(built.epsilon_local) else built.epsilon_local,
        "epsilon_central_target": 4.0,
        "delta": 1e-6,
        "min_crowd_size": 10,
        "query_class": "test",
        "data_fields": ["value"],
        "shuffler_instances": 2,
    }
    data.update(extra)
    return recipe_from_dict(data)


ONE_HOT = recipe_of("onehot", "one_hot_rappor", {"domain_size": 16, "epsilon": 2.0})
TREE = recipe_of("tree", "longitudinal", {"periods": 8, "max_changes": 2, "epsilon": 1.0})
BOOK = RecipeBook([ONE_HOT, TREE])


def message_batch(rows: list[tuple]) -> pa.RecordBatch:
    """ShuffledMessage rows (window_start, channel, recipe_id, crowd_id, payload[, crc[, version]])
    with a correct CRC unless one is given."""
    columns: dict[str, list] = {name: [] for name in MESSAGE_COLUMNS}
    for row in rows:
        start, channel, recipe_id, crowd_id, payload = row[:5]
        crc = row[5] if len(row) > 5 and row[5] is not None else crc32c(payload)
        version = row[6] if len(row) > 6 else 1
        for name, value in zip(
            MESSAGE_COLUMNS,
            (version, start, start + DAY, channel, recipe_id, crowd_id, payload, crc),
            strict=True,
        ):
            columns[name].append(value)
    return pa.RecordBatch.from_pydict(
        columns,
        schema=pa.schema(
            [
                ("schema_version", pa.int32()),
                ("window_start", pa.int64()),
                ("window_end", pa.int64()),
                ("channel", pa.string()),
                ("recipe_id", pa.string()),
                ("crowd_id", pa.string()),
                ("payload", pa.binary()),
                ("payload_crc32c", pa.int64()),
            ]
        ),
    )


def commit_crowd(start: int, channel: str, respondents: int | None, crowd_id=None) -> dict:
    """One crowd of a commit record (schemas/release/commit.py format)."""
    return {
        "window_start_ms": start,
        "window_end_ms": start + DAY,
        "channel": channel,
        "recipe_id": f"{channel}@1",
        "crowd_id": crowd_id,
        "status": "withheld" if respondents is None else "released",
        "respondents_released": respondents,
        "messages_released": 0,
    }


def bucket_payload(value: int) -> bytes:
    return encode_payloads("bucket", {"bucket": np.array([value])}).to_list()[0]


CENSUS_BYTES = encode_payloads(CENSUS, {}, count=1).to_list()[0]  # retired census payload
