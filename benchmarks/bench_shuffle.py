"""Shuffler throughput and memory: ``esa shuffle`` vs a raw fastavro read of the same files.

Report files are generated (2 windows, 2 instances, 2 recipes, 4 crowd IDs, 5 messages per
respondent, arrival order random), then, each in its own child process so that peak memory is
that run's alone:

* baseline: the fastest plain fastavro read of every file, logical types left as ints
  (``benchmarks/common.py`` says how; fastavro's default read, which turns every
  ``timestamp-millis`` into a ``datetime``, is timed on the first file for reference);
* the shuffle pipeline (FnApiRunner, randomized deletion on) on the same files, and again on
  Beam's multi-process DirectRunner with one worker per core (``os.cpu_count()``); in full mode
  also with 1 worker, so that ``multi_process_speedup`` gives the speed-up of all the cores
  against one worker of the same runner on this workload, where the work, not the runner's
  start-up, is most of the time (``bench_scaling``'s sealed workload is a few seconds of work;
  target :data:`TARGET_SPEEDUP_2_WORKERS` with 2 free cores);
* the same pipeline on a fifth of the files, to see whether peak memory grows with input.

Peak memory is each child's own high-water RSS (``VmHWM``, see ``benchmarks/common.py``).

Full mode: 10 M messages; quick mode: 100 k (the memory comparison is skipped; its rate is mostly
the pipeline's ~2 s start-up, so only the full run says anything about throughput).
``--messages=N`` sets the count; ``--sealed`` makes the payloads sealed-shaped (83 bytes starting
with the envelope's version byte), so the shuffler's replay check (``schemas/replays.py``) runs
on every message; ``--wide`` gives clear payloads of the same length: the two runs on the same
count measure the check's cost.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import RAW_READ_SCRIPT, raw_read_note, run_child
from benchmarks.stage_log import describe
from schemas import SCHEMA_VERSION, schema_json
from schemas.avro.container import encode_container
from schemas.avro.crc32c import crc32c_many

DAY_MS = 86_400_000
T0 = 1_700_006_400_000
MESSAGES_PER_RESPONDENT = 5
# The goal for the shuffle against the plain read of the same files, in full mode; the rows say
# whether a run met it (one process, and the multi-process row on all the machine's cores).
TARGET_RATIO = 2.0
# The multi-process DirectRunner's speed-up at 2 workers against 1, with 2 free cores (issue:
# the shuffler >= 1.5x).
TARGET_SPEEDUP_2_WORKERS = 1.5
SEALED_BYTES = 83  # a sealed message of the shipped one-hot recipes: 57 bytes of envelope + pad
ROUTES = {"bench@1": ("bench", 2), "bench_alt@1": ("bench_alt", 1)}

_SHUFFLE = """
import json, sys, time
from benchmarks.common import peak_rss_mb
from apache_beam.options.pipeline_options import PipelineOptions
from benchmarks.stage_log import record_stages, stage_summary
from pipelines import shuffle
from transforms.shuffler.params import RecipeRoute
arguments = json.loads(sys.argv[1])
routes = {name: RecipeRoute(channel, k) for name, (channel, k) in arguments["routes"].items()}
options = PipelineOptions(
    arguments["flags"], input=arguments["input"], output=arguments["output"],
    crowd_threshold=100, deletion_epsilon=1.0, deletion_delta=1e-6, window="1d", instance=None,
    recipe=None, batch_records=50000, watch_interval=10.0, watch_for=None,
)
record_stages()
start = time.perf_counter()
summary = shuffle.run(options, routes=routes)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "records": summary["read"],
                  "adds_up": summary["adds_up"], "released": summary["released"],
                  "peak_rss_mb": peak_rss_mb(), "stage_log": stage_summary(seconds)}))
"""


def generate(
    directory: Path,
    messages: int,
    files: int,
    seed: int = 0,
    sealed: bool = False,
    width: int = 16,
) -> list[str]:
    """Report files with ``messages`` messages in total, written with the vectorized encoder;
    ``sealed``: payloads shaped like sealed envelopes (82 random bytes after the version byte 1),
    so that the shuffler compares them for replays (``schemas/replays.py``); ``width``: bytes of
    a payload that is not (its first byte even, as a clear payload's)."""
    rng = np.random.default_rng(seed)
    respondents = messages // MESSAGES_PER_RESPONDENT
    respondent = rng.permutation(np.repeat(np.arange(respondents), MESSAGES_PER_RESPONDENT))
    recipe_names = np.array(list(ROUTES))
    is_alt = respondent % 4 == 0
    instance = np.where(is_alt, 0, respondent % 2)
    crowd_choices = np.array([None, "a", "b", "c"], dtype=object)
    day = (respondent // 7) % 2
    event_time = T0 + day * DAY_MS + rng.integers(0, DAY_MS, size=respondent.size)
    paths = []
    for index, rows in enumerate(np.array_split(np.arange(respondent.size), files)):
        who = respondent[rows]
        size = SEALED_BYTES if sealed else width
        data = np.frombuffer(rng.bytes(size * rows.size), dtype=np.uint8).reshape(-1, size).copy()
        data[:, 0] = 1 if sealed else data[:, 0] & 0xFE  # the envelope's version byte, or even
        payloads = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), rows.size, [None, pa.py_buffer(data.tobytes())]
        ).cast(pa.binary())
        crcs = crc32c_many(payloads)
        origins = pc.binary_join_element_wise("device-", pa.array(who).cast(pa.string()), "")
        alt = is_alt[who]
        columns = {
            "schema_version": SCHEMA_VERSION,
            "shuffler_instance": instance[who],
            "channel": pa.array(np.where(alt, "bench_alt", "bench")),
            "recipe_id": pa.array(np.where(alt, recipe_names[1], recipe_names[0])),
            "crowd_id": pa.array(crowd_choices[(who // 3) % 4], type=pa.string()),
            "min_crowd_size": 100,
            "origin": origins,
            "event_time": event_time[rows],
            "payload": payloads,
            "payload_crc32c": crcs,
        }
        path = directory / f"reports-{index:03d}.avro"
        content = encode_container(schema_json("report"), columns, rows.size, "deflate", 64_000)
        path.write_bytes(content)
        paths.append(str(path))
    return paths


FNAPI = ["--runner=FnApiRunner"]


def multi_process(workers: int) -> list[str]:
    """Beam's multi-process DirectRunner with ``workers`` worker processes."""
    return ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]


def _target(ratio: float) -> str:
    """The goal against the plain read and whether ``ratio`` meets it."""
    return f"target ratio >= {TARGET_RATIO:g} ({'met' if ratio >= TARGET_RATIO else 'not met'})"


def _default_processes(paths: list[str]) -> str:
    """What ``esa shuffle`` given no runner flags runs ``paths`` on (``shuffle.worker_processes``)."""
    from pipelines.shuffle import worker_processes

    processes = worker_processes(sum(os.path.getsize(path) for path in paths))
    return "one process" if processes == 1 else f"{processes} worker processes"


def _shuffle(paths_glob: str, output: Path, flags: list[str] = FNAPI) -> dict:
    arguments = {"input": paths_glob, "output": str(output), "routes": ROUTES, "flags": flags}
    return run_child(_SHUFFLE, arguments)


def run(
    quick: bool, sealed: bool = False, messages: int | None = None, width: int = 16
) -> list[dict]:
    messages = messages or (100_000 if quick else 10_000_000)
    files = 2 if quick else 20
    work = Path(tempfile.mkdtemp(prefix="bench-shuffle-"))
    try:
        started = time.perf_counter()
        paths = generate(work, messages, files, sealed=sealed, width=width)
        generated = time.perf_counter() - started
        load = os.getloadavg()[0]
        raw = run_child(RAW_READ_SCRIPT, paths)
        shuffled = _shuffle(str(work / "reports-*.avro"), work / "out")
        workers = os.cpu_count() or 1
        parallel = _shuffle(str(work / "reports-*.avro"), work / "out-mp", multi_process(workers))
        raw_rate = raw["records"] / raw["seconds"]
        shuffle_rate = shuffled["records"] / shuffled["seconds"]
        parallel_rate = parallel["records"] / parallel["seconds"]
        note = (
            f"{messages:,} messages in {files} files (generated in {generated:.0f} s); "
            f"FnApiRunner, deletion on; "
            f"{'sealed-shaped' if sealed else f'clear {width}-byte'} payloads; "
            f"released {shuffled['released']:,}, "
            f"accounting adds up: {shuffled['adds_up']}"
        )
        rows = [
            {
                "benchmark": "shuffle",
                "metric": "messages_per_s",
                "value": shuffle_rate,
                "baseline": raw_rate,
                "ratio": shuffle_rate / raw_rate,
                "note": f"baseline: {raw_read_note(raw)}; {_target(shuffle_rate / raw_rate)}; "
                + note,
            },
            {
                "benchmark": "shuffle",
                "metric": "messages_per_s_multi_process",
                "value": parallel_rate,
                "baseline": raw_rate,
                "ratio": parallel_rate / raw_rate,
                "note": f"baseline: the plain read above; {_target(parallel_rate / raw_rate)}; "
                f"multi-process DirectRunner, {workers} workers (the machine's cores; load "
                f"{load:.2f} at start; esa shuffle given no runner flags runs this input on "
                f"{_default_processes(paths)}); released "
                f"{parallel['released']:,}, accounting adds up: {parallel['adds_up']}; "
                f"{describe(parallel['stage_log'])}",
                "stage_log": parallel["stage_log"],
            },
            {
                "benchmark": "shuffle",
                "metric": "peak_rss_mb",
                "value": shuffled["peak_rss_mb"],
                "baseline": raw["peak_rss_mb"],
                "ratio": shuffled["peak_rss_mb"] / raw["peak_rss_mb"],
                "note": f"baseline: peak RSS of the raw fastavro reads (child processes); "
                f"shuffle of {shuffled['records']:,} messages",
            },
        ]
        if not quick and workers > 1:
            one = _shuffle(str(work / "reports-*.avro"), work / "out-mp1", multi_process(1))
            one_rate = one["records"] / one["seconds"]
            target = (
                f"target >= {TARGET_SPEEDUP_2_WORKERS:g}x with 2 free cores "
                f"({'met' if parallel_rate >= TARGET_SPEEDUP_2_WORKERS * one_rate else 'not met'}); "
                if workers == 2
                else ""
            )
            rows.append(
                {
                    "benchmark": "shuffle",
                    "metric": "multi_process_speedup",
                    "value": parallel_rate,
                    "baseline": one_rate,
                    "ratio": parallel_rate / one_rate,
                    "note": f"multi-process DirectRunner, {workers} workers vs 1 worker "
                    f"({one['seconds']:.1f} s vs {parallel['seconds']:.1f} s, start-up included); "
                    f"{target}load {load:.2f} at start; adds up: {one['adds_up']}; 1 worker's "
                    f"{describe(one['stage_log'])}",
                    "stage_log": one["stage_log"],
                }
            )
        if not quick:
            fifth = max(1, files // 5)
            small_dir = work / "small"
            small_dir.mkdir()
            for path in paths[:fifth]:
                os.link(path, small_dir / Path(path).name)
            small = _shuffle(str(small_dir / "reports-*.avro"), work / "out-small")
            rows.append(
                {
                    "benchmark": "shuffle",
                    "metric": "peak_rss_mb_full_input",
                    "value": shuffled["peak_rss_mb"],
                    "baseline": small["peak_rss_mb"],
                    "ratio": shuffled["peak_rss_mb"] / small["peak_rss_mb"],
                    "note": f"baseline: the same pipeline on {small['records']:,} messages "
                    "(ratio ~1 = memory flat in input size)",
                }
            )
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    # --sealed: sealed-shaped payloads (the replay check runs); --wide: clear payloads of the
    # same length (the baseline for --sealed); --messages=N: N messages.
    count = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--messages=")), None)
    wide = SEALED_BYTES if "--wide" in sys.argv else 16
    print(json.dumps(run("--full" not in sys.argv, "--sealed" in sys.argv, count, wide), indent=2))
