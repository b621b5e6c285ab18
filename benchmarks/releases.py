"""Hand-made releases for the analyzer benchmarks: one day window, one released crowd per instance,
with the commit record the shuffler would write (schemas/release.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import release

DAY_MS = 86_400_000
T0 = 1_704_067_200_000


def commit_one_crowd(directory: Path, instance: int, recipe: Any, respondents: int) -> None:
    """Commit ``directory``'s message files as one released crowd of ``recipe`` in the day window
    starting at ``T0``, stating ``respondents`` released and every committed record as a message."""
    files = [release.file_entry(str(directory), p) for p in release.release_files(str(directory))]
    records = sum(f["records"] for f in files)
    crowd = {"window_start_ms": T0, "window_end_ms": T0 + DAY_MS, "channel": recipe.channel,
             "recipe_id": recipe.id, "crowd_id": None, "status": "released",
             "respondents_released": respondents, "messages_released": records}  # fmt: skip
    release.write_commit(
        str(directory),
        {"format": release.RELEASE_FORMAT, "instance": instance, "recipes": [recipe.id],
         "parameters": {"crowd_threshold": 100, "deletion_epsilon": None, "deletion_delta": None,
                        "window": "1d", "window_ms": DAY_MS},
         "crowds": [crowd], "files": files, "records_released": records},
    )  # fmt: skip
