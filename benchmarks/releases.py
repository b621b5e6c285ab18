"""Hand-made releases for the analyzer benchmarks: one day window, one released crowd per instance,
laid out and committed as the shuffler would (``esa-release/2``: schemas/release/commit.py,
schemas/release/crowd_buckets.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from schemas import parsed_schema
from schemas.release import commit
from schemas.release.crowd_buckets import (
    DEFAULT_CROWD_BUCKETS,
    BucketKey,
    crowd_bucket,
    crowd_table_path,
    message_file_path,
)
from transforms.common import avro_io

DAY_MS = 86_400_000
T0 = 1_704_067_200_000


def released_message_files(directory: Path) -> list[str]:
    """The message files of the releases ``directory/instance=<u>/`` (esa-release/2 layout)."""
    return sorted(str(p) for p in directory.glob("instance=*/messages/*.avro"))


def commit_one_crowd(directory: Path, instance: int, recipe: Any, respondents: int) -> None:
    """Commit ``directory``'s message files (any layout under ``messages/``; moved to the
    esa-release/2 names ``messages/<stem>-g<group>.avro`` of the crowd's bucket) as one released
    crowd of ``recipe`` in the day window starting at ``T0``, stating ``respondents`` released and
    every record as a message, with its crowd table."""
    bucket = crowd_bucket(recipe.channel, recipe.id, None, DEFAULT_CROWD_BUCKETS)
    key = BucketKey(T0, instance, bucket)
    found = commit.release_files(str(directory), ("messages",))
    for group, relative in enumerate(found):
        os.replace(directory / relative, directory / message_file_path(key, group))
    for root, dirs, _ in os.walk(directory / "messages", topdown=False):
        for name in dirs:
            os.rmdir(os.path.join(root, name))  # the emptied old layout's directories
    files = [commit.file_entry(str(directory), p) for p in commit.release_files(str(directory))]
    records = sum(f["records"] for f in files)
    crowd = {"window_start": T0, "window_end": T0 + DAY_MS, "instance": instance,
             "channel": recipe.channel, "recipe_id": recipe.id, "crowd_id": None,
             "status": "released", "respondents_released": respondents,
             "messages_released": records}  # fmt: skip
    (directory / "crowds").mkdir(exist_ok=True)
    table = crowd_table_path(key)
    avro_io.write_avro(str(directory / table), parsed_schema("released_crowd"), [crowd])
    files.append(commit.file_entry(str(directory), table))
    commit.write_commit(
        str(directory),
        {"format": commit.RELEASE_FORMAT, "instance": instance, "recipes": [recipe.id],
         "parameters": {"crowd_threshold": 100, "deletion_epsilon": None, "deletion_delta": None,
                        "window": "1d", "window_ms": DAY_MS,
                        "crowd_buckets": DEFAULT_CROWD_BUCKETS},
         "files": files, "records_released": records, "crowds_released": 1, "crowds_withheld": 0,
         "respondents_released": respondents},
    )  # fmt: skip
