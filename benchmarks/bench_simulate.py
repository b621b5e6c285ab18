"""Messages per second written by ``esa simulate`` for a one-hot recipe, next to raw fastavro
writing of the very same records in the same run.

Rows:

* ``simulate_onehot``: the whole ``esa simulate`` pipeline (population, budget checks, k-RAPPOR
  randomization, presence, payload and Report encoding, deflate, files; FnApiRunner, pipeline
  start-up included) against ``fastavro.writer`` writing the records it produced (read back and
  given as dicts, deflate at the same level; only the write is timed).
* ``report_avro_write``: the device side's vectorized Report encoding and container writing alone
  against ``fastavro.writer`` on the same records (same codec and level).
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

import fastavro
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import simulate
from pipelines.commandline.simulate_options import SimulateOptions
from schemas import REPORT, parsed_schema, schema_json
from schemas.avro.container import ContainerWriter
from simulators.plan import ShardSummary
from simulators.reports import encode_report_records
from simulators.shards import ShardContext, simulate_shard

RECIPE = "image_grid_onehot"
LEVEL = 1


def _plain(record: dict) -> dict:
    record = dict(record)
    if not isinstance(record["event_time"], int):
        record["event_time"] = round(record["event_time"].timestamp() * 1000)
    return record


def _fastavro_rate(records: list[dict], repeats: int) -> float:
    schema = parsed_schema(REPORT)
    best = float("inf")
    for _ in range(repeats):
        sink = io.BytesIO()
        started = time.perf_counter()
        fastavro.writer(sink, schema, records, codec="deflate", codec_compression_level=LEVEL)
        best = min(best, time.perf_counter() - started)
    return len(records) / best


def run(quick: bool) -> list[dict]:
    respondents, repeats = (500, 1) if quick else (25_000, 2)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        best, summary = float("inf"), {}
        for attempt in range(repeats):
            output = Path(scratch) / f"run{attempt}"
            values = {
                "simulate_recipe": RECIPE,
                "simulate_population": "image:disc",
                "simulate_respondents": respondents,
                "simulate_output": str(output),
                "simulate_seed": 1,
                "simulate_compression_level": LEVEL,
            }
            defaults = {f"simulate_{flag.name}": flag.default for flag in SimulateOptions.FLAGS}
            options = PipelineOptions(["--runner=FnApiRunner"], **{**defaults, **values})
            started = time.perf_counter()
            summary = simulate.run(options)
            best = min(best, time.perf_counter() - started)
        written = summary["messages"] + summary["presence_messages"]
        records = []
        for path in sorted(output.glob("instance=*/*.avro")):
            with open(path, "rb") as handle:
                records.extend(_plain(r) for r in fastavro.reader(handle))
        assert len(records) == written
        fastavro_rate = _fastavro_rate(records, repeats)
        rows.append(
            {
                "benchmark": "simulate_onehot",
                "metric": "messages_per_s",
                "value": written / best,
                "baseline": fastavro_rate,
                "ratio": written / best / fastavro_rate,
                "note": f"esa simulate {RECIPE}, {respondents} respondents, {written} messages "
                f"incl. presence, FnApiRunner, deflate {LEVEL}; baseline fastavro.writer of the same "
                "records",
            }
        )

    # The same records again, encoded and written by the device side's vectorized writer.
    context = ShardContext(simulate.plan_from_options(options))
    batches = [
        batch
        for shard in context.shards()
        for item in simulate_shard(context, shard)
        if not isinstance(item, ShardSummary)
        for batch in item[1]
    ]
    count = sum(len(batch) for batch in batches)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        writer = ContainerWriter(io.BytesIO(), schema_json(REPORT), compression_level=LEVEL)
        for batch in batches:
            writer.write(encode_report_records(batch))
        best = min(best, time.perf_counter() - started)
    rows.append(
        {
            "benchmark": "report_avro_write",
            "metric": "records_per_s",
            "value": count / best,
            "baseline": fastavro_rate,
            "ratio": count / best / fastavro_rate,
            "note": "vectorized Report encoding + container writing (deflate "
            f"{LEVEL}) of {count} records; baseline fastavro.writer of the same records",
        }
    )
    return rows
