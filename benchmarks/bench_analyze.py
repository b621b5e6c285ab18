"""Shuffle + analyze end to end: messages/s and peak memory against raw fastavro reads.

Full mode: about 10 million messages of the shipped 64 x 64 image-grid recipe (one-hot k-RAPPOR,
ε_ℓ = 4.45, ~48 messages per respondent) re-issued for K = 2 shuffler instances, plus one presence
message (empty payload) per respondent and instance. Report files are generated with the vectorized encoder (not
timed), then each step runs in its own child process, so peak memory (``VmHWM``) is its own:

* the fastest plain fastavro read of the report files, logical types left as ints (the shuffle's
  ceiling; ``benchmarks/common.py`` says how);
* ``esa shuffle --instance u`` for u = 0, 1 (FnApiRunner);
* the same read of the released message files (the analyzer's ceiling);
* ``esa analyze`` over both releases (FnApiRunner, no pictures), timed from the call to its end:
  the driver's verification of the releases (SHA-256 of every file) and the pipeline (which also
  checks each crowd's messages against its crowd table).

Rows: analyze messages/s against its raw read (target ratio >= 3 in full mode), shuffle + analyze end to end against the two raw reads together, and peak memory. Quick mode (a smoke test) skips the
shuffler: it writes ~100 k released messages and their commit records directly and times the
analyzer alone.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.common import RAW_READ_SCRIPT, raw_read_note, run_child
from benchmarks.releases import DAY_MS, T0, commit_one_crowd, released_message_files
from schemas import SCHEMA_VERSION, schema_json
from schemas.avro.container import encode_container
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import encode_message_batch
from schemas.recipes import load_recipe
from simulators.shards import presence_payloads
from transforms.analyzer.arithmetic import payloads_subset

INSTANCES = 2
ROWS_PER_FILE = 1_000_000

_SHUFFLE = """
import json, sys
from benchmarks.common import peak_rss_mb
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import shuffle
a = json.loads(sys.argv[1])
options = PipelineOptions(["--runner=FnApiRunner"], input=a["input"], output=a["output"],
                          instance=a["instance"], recipe=[a["recipe"]])
summary = shuffle.run(options)
print(json.dumps({"seconds": summary["seconds"], "records": summary["read"],
                  "released": summary["released"], "adds_up": summary["adds_up"],
                  "peak_rss_mb": peak_rss_mb()}))
"""

_ANALYZE = """
import json, sys, time
from benchmarks.common import peak_rss_mb
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import analyze
a = json.loads(sys.argv[1])
options = PipelineOptions(["--runner=FnApiRunner"], analyze_input=[a["input"]],
                          analyze_output=a["output"], analyze_recipe=[a["recipe"]],
                          analyze_no_pictures=True)
began = time.monotonic()
summary = analyze.run(options)
print(json.dumps({"seconds": time.monotonic() - began, "pipeline_seconds": summary["seconds"],
                  "records": summary["metrics"]["read"],
                  "adds_up": summary["metrics"]["adds_up"], "peak_rss_mb": peak_rss_mb()}))
"""


def _recipe(directory: Path) -> tuple[str, object]:
    from pipelines.run import recipe_for_instances

    recipe = recipe_for_instances(load_recipe("image_grid_onehot"), INSTANCES)
    path = directory / "recipe.json"
    path.write_text(recipe.to_json())
    return str(path), recipe


def _write(path: Path, schema: str, columns: dict, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_container(schema_json(schema), columns, rows, "deflate"))


def generate(directory: Path, respondents: int, released: bool, seed: int = 0) -> dict:
    """One instance's files per instance: Report files (``released=False``) under
    ``reports/instance=<u>/``, or ShuffledMessage files laid out as releases under
    ``shuffled/instance=<u>/messages/...``. Rows are in random order."""
    recipe_path, recipe = _recipe(directory)
    randomizer = recipe.build_randomizer()
    rng = np.random.default_rng(seed)
    values = rng.integers(0, randomizer.domain_size, size=respondents)
    messages = randomizer.randomize(values, rng)
    payloads = encode_message_batch(messages, recipe.payload_kind)
    instance = rng.integers(0, INSTANCES, size=len(messages))
    # Presence messages (empty payloads) go to the shuffler only; a release never holds them.
    presence = presence_payloads(0 if released else respondents)
    origins = pa.array([f"device-{i:08d}" for i in range(respondents)], pa.string())
    paths: dict[int, list[str]] = {}
    total = 0
    for u in range(INSTANCES):
        chosen = np.flatnonzero(instance == u)
        body = pa.concat_arrays([payloads_subset(payloads, chosen).to_arrow(), presence.to_arrow()])
        who = np.concatenate([messages.respondent[chosen], np.arange(len(presence))])
        order = rng.permutation(who.size)
        body, who = body.take(pa.array(order)), who[order]
        crc = crc32c_many(body).astype(np.int64)
        total += who.size
        paths[u] = []
        for index, start in enumerate(range(0, who.size, ROWS_PER_FILE)):
            stop = min(who.size, start + ROWS_PER_FILE)
            common = {
                "schema_version": SCHEMA_VERSION,
                "channel": recipe.channel,
                "recipe_id": recipe.id,
                "crowd_id": None,
                "payload": body.slice(start, stop - start),
                "payload_crc32c": crc[start:stop],
            }
            if released:
                columns = {**common, "window_start": T0, "window_end": T0 + DAY_MS}
                path = (
                    directory / "shuffled" / f"instance={u}" / "messages"
                    / f"window_start={T0}" / f"channel={recipe.channel}" / f"part-{index:03d}.avro"
                )  # fmt: skip
                _write(path, "shuffled_message", columns, stop - start)
            else:
                columns = {
                    **common,
                    "shuffler_instance": u,
                    "min_crowd_size": recipe.min_crowd_size,
                    "origin": origins.take(pa.array(who[start:stop])),
                    "event_time": T0 + rng.integers(0, DAY_MS, size=stop - start),
                }
                path = directory / "reports" / f"instance={u}" / f"reports-{index:03d}.avro"
                _write(path, "report", columns, stop - start)
            paths[u].append(str(path))
        if released:
            commit_one_crowd(directory / "shuffled" / f"instance={u}", u, recipe, respondents)
    return {"recipe": recipe_path, "paths": paths, "messages": total}


def run(quick: bool) -> list[dict]:
    respondents = 2_000 if quick else 200_000
    work = Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    try:
        started = time.perf_counter()
        data = generate(work, respondents, released=quick)
        generated = time.perf_counter() - started
        shuffled_dir = work / "shuffled"
        rows: list[dict] = []
        shuffles = []
        if not quick:
            all_reports = [p for u in sorted(data["paths"]) for p in data["paths"][u]]
            raw_reports = run_child(RAW_READ_SCRIPT, all_reports)
            for u in range(INSTANCES):
                shuffles.append(
                    run_child(
                        _SHUFFLE,
                        {
                            "input": str(work / "reports" / f"instance={u}" / "*.avro"),
                            "output": str(shuffled_dir / f"instance={u}"),
                            "instance": u,
                            "recipe": data["recipe"],
                        },
                    )
                )
        raw_released = run_child(RAW_READ_SCRIPT, released_message_files(shuffled_dir))
        analyzed = run_child(
            _ANALYZE,
            {
                "input": str(shuffled_dir),
                "output": str(work / "analysis"),
                "recipe": data["recipe"],
            },
        )
        messages = analyzed["records"]
        analyze_rate = messages / analyzed["seconds"]
        raw_rate = raw_released["records"] / raw_released["seconds"]
        note = (
            f"{messages:,} released messages ({respondents:,} respondents, image_grid_onehot, "
            f"K = {INSTANCES}; generated in {generated:.0f} s); FnApiRunner, "
            f"{analyzed['seconds']:.1f} s with the driver's verification "
            f"(pipeline {analyzed['pipeline_seconds']:.1f} s); accounting adds up: "
            f"{analyzed['adds_up']}"
        )
        rows.append(
            {
                "benchmark": "analyze",
                "metric": "messages_per_s",
                "value": analyze_rate,
                "baseline": raw_rate,
                "ratio": analyze_rate / raw_rate,
                "note": f"baseline: {raw_read_note(raw_released)}; target ratio >= 3 in full "
                f"mode ({'met' if analyze_rate >= 3 * raw_rate else 'not met'}; quick mode is "
                "mostly the pipeline's fixed cost); " + note,
            }
        )
        rows.append(
            {
                "benchmark": "analyze",
                "metric": "peak_rss_mb",
                "value": analyzed["peak_rss_mb"],
                "baseline": raw_released["peak_rss_mb"],
                "ratio": analyzed["peak_rss_mb"] / raw_released["peak_rss_mb"],
                "note": "baseline: peak RSS of the raw fastavro reads (child processes)",
            }
        )
        if not quick:
            read = sum(s["records"] for s in shuffles)
            shuffle_seconds = sum(s["seconds"] for s in shuffles)
            end_to_end = read / (shuffle_seconds + analyzed["seconds"])
            ceiling = read / (raw_reports["seconds"] + raw_released["seconds"])
            rows.append(
                {
                    "benchmark": "shuffle+analyze",
                    "metric": "messages_per_s",
                    "value": end_to_end,
                    "baseline": ceiling,
                    "ratio": end_to_end / ceiling,
                    "note": f"{read:,} report messages through {INSTANCES} shufflers "
                    f"({shuffle_seconds:.0f} s) and the analyzer ({analyzed['seconds']:.0f} s); "
                    "baseline: plain fastavro reads of the reports and the released files, "
                    "logical types as ints",
                }
            )
            rows.append(
                {
                    "benchmark": "shuffle+analyze",
                    "metric": "peak_rss_mb",
                    "value": max(max(s["peak_rss_mb"] for s in shuffles), analyzed["peak_rss_mb"]),
                    "baseline": max(raw_reports["peak_rss_mb"], raw_released["peak_rss_mb"]),
                    "ratio": None,
                    "note": "largest peak RSS of any step (each in its own process); shuffles: "
                    + ", ".join(f"{s['peak_rss_mb']:.0f}" for s in shuffles)
                    + " MB",
                }
            )
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
