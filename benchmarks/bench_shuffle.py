"""Shuffler throughput and memory: ``esa shuffle`` vs a raw fastavro read of the same files.

Report files are generated (2 windows, 2 instances, 2 recipes, 4 crowd IDs, 5 messages per
respondent, arrival order random), then, each in its own child process so that peak memory is
that run's alone:

* baseline: the fastest plain fastavro read of every file, ``for record in fastavro.reader(f)``
  with logical types left as ints (fastavro's defaults turn every ``timestamp-millis`` into a
  ``datetime``, about a third of the default read's time). Two ways are timed, file by file in
  turn, and the faster one is the baseline: the file's header with the schema's ``logicalType``
  keys removed (what the shuffler's reader decodes), and fastavro's ``timestamp-millis`` reader
  unregistered. (Passing a reader schema without ``logicalType`` is slower still: fastavro then
  resolves schemas per record.) The default read is timed on the first file for reference;
* the shuffle pipeline (FnApiRunner, randomized deletion on) on the same files;
* the same pipeline on a fifth of the files, to see whether peak memory grows with input.

Peak memory is each child's own high-water RSS (``VmHWM``): ``getrusage`` would also count the
parent's pages a child holds between fork and exec.

Full mode: 10 M messages; quick mode: 100 k (the memory comparison is skipped; its rate is mostly
the pipeline's ~2 s start-up, so only the full run says anything about throughput).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import SCHEMA_VERSION, schema_json
from transforms import avro_io
from transforms.shuffle_core import crc32c_of_payloads

DAY_MS = 86_400_000
T0 = 1_700_006_400_000
MESSAGES_PER_RESPONDENT = 5
ROUTES = {"bench@1": ("bench", 2), "bench_alt@1": ("bench_alt", 1)}

# Peak RSS of the child itself: VmHWM of its own address space. getrusage's ru_maxrss would also
# count the parent's pages the child held between fork and exec.
_PEAK_RSS = """
import resource
def peak_rss_mb():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
"""

_RAW_READ = (
    _PEAK_RSS
    + """
import io, json, sys, time, fastavro
from fastavro import logical_readers
from fastavro.read import HEADER_SCHEMA

def strip(schema):
    if isinstance(schema, dict):
        return {k: strip(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [strip(item) for item in schema]
    return schema

def varint(value):
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

class Prefixed(io.RawIOBase):
    # A new header, then the rest of the file (streamed).

    def __init__(self, prefix, handle):
        self.prefix, self.handle = prefix, handle

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self.prefix[: len(buffer)] if self.prefix else self.handle.read(len(buffer))
        self.prefix = self.prefix[len(data) :]
        buffer[: len(data)] = data
        return len(data)

def without_logical_types(handle):
    header = fastavro.schemaless_reader(handle, HEADER_SCHEMA)
    meta = dict(header["meta"])
    meta["avro.schema"] = json.dumps(strip(json.loads(meta["avro.schema"]))).encode()
    body = varint(len(meta)) + b"".join(
        varint(len(k.encode())) + k.encode() + varint(len(v)) + v for k, v in meta.items()
    )
    prefix = b"Obj\\x01" + body + varint(0) + header["sync"]
    return io.BufferedReader(Prefixed(prefix, handle), 1 << 20)

def read_stripped_header(path):
    with open(path, "rb") as handle:
        count = 0
        for record in fastavro.reader(without_logical_types(handle)):
            count += 1
    return count, type(record["event_time"])

def read_without_timestamp_reader(path):
    saved = logical_readers.LOGICAL_READERS.pop("long-timestamp-millis")
    try:
        with open(path, "rb") as handle:
            count = 0
            for record in fastavro.reader(handle):
                count += 1
    finally:
        logical_readers.LOGICAL_READERS["long-timestamp-millis"] = saved
    return count, type(record["event_time"])

def read_default(path):
    with open(path, "rb") as handle:
        count = 0
        for record in fastavro.reader(handle):
            count += 1
    return count, type(record["event_time"])

paths = json.loads(sys.argv[1])
ways = {"stripped_header": read_stripped_header, "no_timestamp_reader": read_without_timestamp_reader}
seconds = dict.fromkeys(ways, 0.0)
records = dict.fromkeys(ways, 0)
for path in paths:
    for name, read in ways.items():
        start = time.perf_counter()
        count, kind = read(path)
        seconds[name] += time.perf_counter() - start
        records[name] += count
        assert kind is int, (name, kind)
best = min(seconds, key=seconds.get)
# The default read, for reference only: on the first file.
start = time.perf_counter()
default_records = read_default(paths[0])[0]
default_seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds[best], "records": records[best], "way": best,
                  "rates": {name: records[name] / seconds[name] for name in ways},
                  "default_rate": default_records / default_seconds,
                  "peak_rss_mb": peak_rss_mb()}))
"""
)

_SHUFFLE = (
    _PEAK_RSS
    + """
import json, sys, time
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import shuffle
from transforms.shuffle_core import RecipeRoute
arguments = json.loads(sys.argv[1])
routes = {name: RecipeRoute(channel, k) for name, (channel, k) in arguments["routes"].items()}
options = PipelineOptions(
    ["--runner=FnApiRunner"], input=arguments["input"], output=arguments["output"],
    crowd_threshold=100, deletion_epsilon=1.0, deletion_delta=1e-6, window="1d", instance=None,
    recipe=None, batch_records=50000, messages_per_shard=200000, messages_per_file=200000,
    watch_interval=10.0, watch_for=None,
)
start = time.perf_counter()
summary = shuffle.run(options, routes=routes)
print(json.dumps({"seconds": time.perf_counter() - start, "records": summary["read"],
                  "adds_up": summary["adds_up"], "released": summary["released"],
                  "peak_rss_mb": peak_rss_mb()}))
"""
)


def generate(directory: Path, messages: int, files: int, seed: int = 0) -> list[str]:
    """Report files with ``messages`` messages in total, written with the vectorized encoder."""
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
        payloads = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), rows.size, [None, pa.py_buffer(rng.bytes(16 * rows.size))]
        ).cast(pa.binary())
        crcs = crc32c_of_payloads(payloads)
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
        content = avro_io.encode_container(
            schema_json("report"), columns, rows.size, "deflate", 64_000
        )
        path.write_bytes(content)
        paths.append(str(path))
    return paths


def _child(script: str, argument: str) -> dict:
    """Run ``script`` in a fresh interpreter; its JSON result (with its own peak RSS in MB)."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, argument],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    output, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"benchmark child failed with exit code {process.returncode}")
    return json.loads(output.decode().strip().splitlines()[-1])


def _rates(raw: dict) -> str:
    return ", ".join(f"{name} {rate:,.0f}/s" for name, rate in sorted(raw["rates"].items()))


def _shuffle(paths_glob: str, output: Path) -> dict:
    arguments = {"input": paths_glob, "output": str(output), "routes": ROUTES}
    return _child(_SHUFFLE, json.dumps(arguments))


def run(quick: bool) -> list[dict]:
    messages = 100_000 if quick else 10_000_000
    files = 2 if quick else 20
    work = Path(tempfile.mkdtemp(prefix="bench-shuffle-"))
    try:
        started = time.perf_counter()
        paths = generate(work, messages, files)
        generated = time.perf_counter() - started
        raw = _child(_RAW_READ, json.dumps(paths))
        shuffled = _shuffle(str(work / "reports-*.avro"), work / "out")
        raw_rate = raw["records"] / raw["seconds"]
        shuffle_rate = shuffled["records"] / shuffled["seconds"]
        note = (
            f"{messages:,} messages in {files} files (generated in {generated:.0f} s); "
            f"FnApiRunner, deletion on; released {shuffled['released']:,}, "
            f"accounting adds up: {shuffled['adds_up']}"
        )
        rows = [
            {
                "benchmark": "shuffle",
                "metric": "messages_per_s",
                "value": shuffle_rate,
                "baseline": raw_rate,
                "ratio": shuffle_rate / raw_rate,
                "note": (
                    f"baseline: fastest plain fastavro read of the same files, logical types as "
                    f"ints ({raw['way']}; rates {_rates(raw)}); fastavro's default read with "
                    f"datetime conversion (first file): {raw['default_rate']:,.0f}/s; "
                    "target ratio >= 1/3; "
                )
                + note,
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
    print(json.dumps(run("--full" not in sys.argv), indent=2))
