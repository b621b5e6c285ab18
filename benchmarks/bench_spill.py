"""The shuffler's spill design against Beam's own GroupByKey shuffle of the same rows.

Both read and validate the same report files with the same steps (``ReadReportFile``,
``ValidateBatch``, ``bucket_rows``: windows, keyed origin hashes, crowd buckets, sort), and release
every crowd above the threshold as uniformly permuted ShuffledMessage files (one per crowd
bucket). They differ in what goes
through Beam's shuffle:

* spill (``esa shuffle``, deletion off): rows are written once to Arrow IPC spill files and only
  pointers are grouped; shards, counts and groups read the rows back by pointer;
* GroupByKey: each batch's rows of a crowd bucket (origin hash, payload, CRC, crowd as an Arrow
  record batch) go through ``GroupByKey`` by bucket, and one worker holds a whole bucket to count
  its crowds' distinct origins and permute them.

Each run is a child process (FnApiRunner) so peak memory (``VmHWM``) is its own; both at two
input sizes in the same run, to show whether memory follows the input. Rows: messages/s (spill
against GroupByKey) and peak RSS, at the larger size and against the smaller.

Full mode: 1 M and 5 M messages; quick mode: 100 k and 500 k.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_shuffle import ROUTES, generate
from benchmarks.common import run_child

_ARGUMENTS = """
import json, sys, time
from apache_beam.options.pipeline_options import PipelineOptions
from benchmarks.common import peak_rss_mb
from pipelines import shuffle
from pipelines.commandline.shuffle_options import ShuffleOptions
from transforms.shuffler.params import RecipeRoute
a = json.loads(sys.argv[1])
routes = {name: RecipeRoute(channel, k) for name, (channel, k) in a["routes"].items()}
options = PipelineOptions(
    ["--runner=FnApiRunner"], input=a["input"], output=a["output"], crowd_threshold=100,
    window="1d", instance=None, recipe=None, batch_records=50000, messages_per_shard=200000,
    messages_per_file=10000000, watch_interval=10.0, watch_for=None,
)
"""

_SPILL = (
    _ARGUMENTS
    + """
start = time.perf_counter()
summary = shuffle.run(options, routes=routes)
print(json.dumps({"seconds": time.perf_counter() - start, "records": summary["read"],
                  "released": summary["released"], "peak_rss_mb": peak_rss_mb()}))
"""
)

_GROUP_BY_KEY = (
    _ARGUMENTS
    + """
import glob, os
import apache_beam as beam
import numpy as np
import pyarrow as pa
from privacy.noise import os_random_source
from transforms.shuffler import decide
from transforms.shuffler import report_rows
from transforms.shuffler.read import ReadReportFile, ValidateBatch
from schemas.release.crowd_buckets import crowd_order
from transforms.shuffler.sinks import ReleasedGroup, WriteShuffledMessages, read_index
from transforms.shuffler.spill import crowd_of_text
from transforms.shuffler.steps import bucket_rows, crowd_codes, distinct_per_crowd

config = shuffle.shuffle_config(options.view_as(ShuffleOptions), False, routes)
hash_key = report_rows.new_origin_hash_key(os_random_source())
COLUMNS = ["origin_hash", "payload", "payload_crc32c", "crowd"]

def by_bucket(element):
    item, valid = element
    batch = item.columns
    if valid.size < batch.num_rows:
        batch = batch.take(pa.array(valid))
    keyed = bucket_rows(batch, config.window, hash_key, config.crowd_buckets)
    for key, begin, end in zip(keyed.keys, keyed.starts[:-1].tolist(), keyed.starts[1:].tolist()):
        yield tuple(key), keyed.rows.slice(begin, end - begin).select(COLUMNS)

class Release(beam.DoFn):
    def setup(self):
        self.source = os_random_source()
    def process(self, element):
        key, batches = element
        table = pa.Table.from_batches(list(batches)).unify_dictionaries().combine_chunks()
        crowds, texts = crowd_codes(table.column("crowd"))
        distinct = distinct_per_crowd(crowds, table.column("origin_hash").to_numpy(), len(texts))
        keys = [crowd_of_text(text) for text in texts]
        rank = np.empty(len(keys), dtype=np.int64)
        rank[sorted(range(len(keys)), key=lambda i: crowd_order(*keys[i]))] = np.arange(len(keys))
        kept = np.flatnonzero(distinct[crowds] >= config.crowd_threshold)
        if not kept.size:
            return
        shuffled = kept[decide.release_order(kept.size, self.source)]
        order = shuffled[np.argsort(rank[crowds[shuffled]], kind="stable")]
        per_crowd = np.bincount(rank[crowds[order]], minlength=len(keys))
        ordered = [None] * len(keys)
        for index, position in enumerate(rank.tolist()):
            ordered[position] = keys[index]
        take = pa.array(order)
        yield ReleasedGroup(key, 0, key[0] + config.window.period_ms,
                            tuple(k for k, n in zip(ordered, per_crowd) if n),
                            tuple(int(n) for n in per_crowd if n),
                            table.column("payload").combine_chunks().take(take),
                            table.column("payload_crc32c").combine_chunks().take(take).to_numpy())

start = time.perf_counter()
private = a["output"] + ".private"
with beam.Pipeline(options=options) as pipeline:
    read = (pipeline | beam.Create(sorted(glob.glob(a["input"]))) | beam.Reshuffle()
            | beam.ParDo(ReadReportFile(config.batch_records)).with_outputs("unreadable",
                                                                          main="batches"))
    valid = read.batches | beam.ParDo(ValidateBatch(config.rules)).with_outputs(
        "dead_letter", "counts", main="valid")
    released = (valid.valid | beam.FlatMap(by_bucket) | "GroupByBucket" >> beam.GroupByKey()
                | beam.ParDo(Release()))
    released | WriteShuffledMessages(a["output"], private)
seconds = time.perf_counter() - start
records = sum(entry["records"] for entry in read_index(private))
print(json.dumps({"seconds": seconds, "records": a["messages"], "released": records,
                  "peak_rss_mb": peak_rss_mb()}))
"""
)


def measure(work: Path, messages: int, files: int) -> dict[str, dict]:
    """Generate ``messages`` and run both designs on them; each child's result."""
    inputs = work / f"reports-{messages}"
    inputs.mkdir(parents=True)
    generate(inputs, messages, files)
    results = {}
    for name, script in (("spill", _SPILL), ("group_by_key", _GROUP_BY_KEY)):
        arguments = {
            "input": str(inputs / "reports-*.avro"),
            "output": str(work / f"{name}-{messages}"),
            "routes": ROUTES,
            "messages": messages,
        }
        results[name] = run_child(script, arguments)
    if results["spill"]["released"] != results["group_by_key"]["released"]:
        raise RuntimeError(f"the two designs released different counts: {results}")
    return results


def run(quick: bool) -> list[dict]:
    small, large = (100_000, 500_000) if quick else (1_000_000, 5_000_000)
    work = Path(tempfile.mkdtemp(prefix="bench-spill-"))
    try:
        before = measure(work, small, 2)
        after = measure(work, large, 4)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    spill, gbk = after["spill"], after["group_by_key"]
    rate = {name: result["records"] / result["seconds"] for name, result in after.items()}
    note = f"{large:,} messages, FnApiRunner, no deletion, released {spill['released']:,} by both"
    rows = [
        {
            "benchmark": "spill_vs_gbk",
            "metric": "messages_per_s",
            "value": rate["spill"],
            "baseline": rate["group_by_key"],
            "ratio": rate["spill"] / rate["group_by_key"],
            "note": "baseline: the same release through Beam's GroupByKey of the rows; " + note,
        },
        {
            "benchmark": "spill_vs_gbk",
            "metric": "peak_rss_mb",
            "value": spill["peak_rss_mb"],
            "baseline": gbk["peak_rss_mb"],
            "ratio": spill["peak_rss_mb"] / gbk["peak_rss_mb"],
            "note": "baseline: GroupByKey design's peak RSS; " + note,
        },
    ]
    for name in ("spill", "group_by_key"):
        rows.append(
            {
                "benchmark": f"spill_vs_gbk_{name}",
                "metric": "peak_rss_mb_growth",
                "value": after[name]["peak_rss_mb"],
                "baseline": before[name]["peak_rss_mb"],
                "ratio": after[name]["peak_rss_mb"] / before[name]["peak_rss_mb"],
                "note": f"{large:,} vs {small:,} messages (ratio ~1 = memory flat in input)",
            }
        )
    return rows


if __name__ == "__main__":
    print(json.dumps(run("--full" not in sys.argv), indent=2))
