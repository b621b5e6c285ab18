"""Opening an esa-release/2 release on the analyzer's driver: time and peak memory against crowds.

``pipelines.analyze.open_release`` verifies the commit record, every file's SHA-256 and record
count, each crowd table (one at a time) and, per bucket, each crowd's messages against its table.
Nothing may be held per crowd for the whole release, so peak RSS should stay flat from few to many
crowds. Two hand-written releases (3 messages per crowd, 16 buckets, one window) of a small and a
10x larger number of crowds are opened in fresh child processes; the rows give the large one's
peak RSS and crowds/s with the small one's as the same-run baseline, and the seconds against a
raw fastavro read of the same message files (``benchmarks.common.raw_read``).
Quick: 2,000 vs 20,000 crowds; full: 10,000 vs 100,000. What may grow is one bucket's table and
counts (crowds / 16 here), never a list of every crowd. Measured (full, one run, shared 2-core
machine): peak RSS 240 -> 271 MB (1.13; 0.36 KB per added crowd, the largest bucket's table of
~6,250 crowds), 17,600 -> 19,700 crowds/s, 4.5x a raw fastavro read of the message files.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.common import RAW_READ_SCRIPT, run_child
from schemas import SCHEMA_VERSION, parsed_schema, schema_json
from schemas.release import commit
from schemas.release.crowd_buckets import (
    DEFAULT_CROWD_BUCKETS,
    BucketKey,
    crowd_bucket,
    crowd_order,
    crowd_table_path,
    message_file_path,
)
from transforms.common import avro_io

T0 = 1_704_067_200_000
DAY_MS = 86_400_000
PER_CROWD = 3
_OPEN = """
import json, sys, time
from benchmarks.common import peak_rss_mb
from pipelines.analyze import open_release
started = time.perf_counter()
opened = open_release(json.loads(sys.argv[1]))
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_rss_mb(),
                  "records": opened.commit["records_released"]}))
"""


def write_release(directory: Path, crowds: int) -> list[str]:
    """A release of ``crowds`` released crowds (3 respondents, 3 messages each); its message
    files."""
    stems: dict[BucketKey, list[str]] = defaultdict(list)
    for index in range(crowds):
        crowd_id = f"c{index:07d}"
        bucket = crowd_bucket("ch", "r@1", crowd_id, DEFAULT_CROWD_BUCKETS)
        stems[BucketKey(T0, 0, bucket)].append(crowd_id)
    (directory / "messages").mkdir(parents=True)
    (directory / "crowds").mkdir()
    schema = schema_json("shuffled_message")
    for key, ids in stems.items():
        ids.sort(key=lambda c: crowd_order("ch", "r@1", c))
        rows = len(ids) * PER_CROWD
        payloads = pa.array([b"payload-%d" % i for i in range(rows)], pa.binary())
        columns = {
            "schema_version": SCHEMA_VERSION,
            "window_start": T0,
            "window_end": T0 + DAY_MS,
            "channel": "ch",
            "recipe_id": "r@1",
            "crowd_id": pa.array(np.repeat(np.array(ids, dtype=object), PER_CROWD), pa.string()),
            "payload": payloads,
            "payload_crc32c": np.zeros(rows, np.int64),
        }
        data = avro_io.encode_container(schema, columns, rows, "null")
        (directory / message_file_path(key, 0)).write_bytes(data)
        table = [
            {"window_start": T0, "window_end": T0 + DAY_MS, "instance": 0, "channel": "ch",
             "recipe_id": "r@1", "crowd_id": crowd_id, "status": "released",
             "respondents_released": PER_CROWD, "messages_released": PER_CROWD}
            for crowd_id in ids
        ]  # fmt: skip
        avro_io.write_avro(
            str(directory / crowd_table_path(key)), parsed_schema("released_crowd"), table
        )
    paths = commit.release_files(str(directory), ("messages", "crowds"))
    files = [commit.file_entry(str(directory), path) for path in paths]
    commit.write_commit(
        str(directory),
        {"format": commit.RELEASE_FORMAT, "instance": 0, "recipes": ["r@1"],
         "parameters": {"crowd_threshold": 2, "deletion_epsilon": None, "deletion_delta": None,
                        "window": "1d", "window_ms": DAY_MS,
                        "crowd_buckets": DEFAULT_CROWD_BUCKETS},
         "files": files, "records_released": crowds * PER_CROWD, "crowds_released": crowds,
         "crowds_withheld": 0, "respondents_released": crowds * PER_CROWD},
    )  # fmt: skip
    return [str(directory / path) for path in paths if path.startswith("messages/")]


def run(quick: bool) -> list[dict]:
    small, large = (2_000, 20_000) if quick else (10_000, 100_000)
    work = Path(tempfile.mkdtemp(prefix="bench-release-verify-"))
    try:
        measured = {}
        for crowds in (small, large):
            directory = work / f"crowds-{crowds}"
            files = write_release(directory, crowds)
            opened = run_child(_OPEN, str(directory))
            assert opened["records"] == crowds * PER_CROWD
            measured[crowds] = (opened, run_child(RAW_READ_SCRIPT, files))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (little, _), (big, raw) = measured[small], measured[large]
    added_kb = (big["peak_rss_mb"] - little["peak_rss_mb"]) * 1024 / (large - small)
    raw_seconds = raw["seconds"]
    note = (
        f"open_release (verify + per-bucket crowd counts) in a fresh process, {PER_CROWD} "
        f"messages per crowd, {DEFAULT_CROWD_BUCKETS} buckets, one window"
    )
    return [
        {
            "benchmark": "release_verify",
            "metric": f"peak_rss_mb_{large}_crowds",
            "value": big["peak_rss_mb"],
            "baseline": little["peak_rss_mb"],
            "ratio": big["peak_rss_mb"] / little["peak_rss_mb"],
            "note": f"baseline: {small:,} crowds; {added_kb:.2f} KB per added crowd; {note}",
        },
        {
            "benchmark": "release_verify",
            "metric": f"crowds_per_s_{large}_crowds",
            "value": large / big["seconds"],
            "baseline": small / little["seconds"],
            "ratio": (large / big["seconds"]) / (small / little["seconds"]),
            "note": f"baseline: {small:,} crowds ({little['seconds']:.2f} s vs "
            f"{big['seconds']:.2f} s); {note}",
        },
        {
            "benchmark": "release_verify",
            "metric": "open_vs_raw_read_seconds",
            "value": big["seconds"],
            "baseline": raw_seconds,
            "ratio": big["seconds"] / raw_seconds,
            "note": f"open_release of {large:,} crowds vs a raw fastavro read of its message files",
        },
    ]
