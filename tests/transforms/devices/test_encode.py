"""The device side as Beam transforms: vectorized Report encoding, Avro files, shards, summaries."""

from __future__ import annotations

import io

import apache_beam as beam
import fastavro
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from schemas import REPORT, crc32c, parsed_schema, schema_json
from schemas.avro.crc32c import crc32c_many
from schemas.payloads import encode_payloads
from schemas.recipes import load_recipe
from simulators.fleet import format_origins, origin_ids
from simulators.plan import ShardSummary, SimulationPlan
from simulators.reports import ReportBatch, encode_report_records
from simulators.shards import ShardContext, shard_file_name, simulate_shard
from transforms.devices.encode import CombineShardSummaries, EncodeReports, write_shard


def random_batch(n: int, seed: int, crowd_id: str | None = None, instance: int = 2) -> ReportBatch:
    rng = np.random.default_rng(seed)
    # Buckets from 0 to 2^40 and times from 0 to 2^45 give varints of every length.
    payloads = encode_payloads(
        "bucket", {"bucket": rng.integers(0, 2**40, n) >> rng.integers(0, 40, n)}
    )
    return ReportBatch(
        shuffler_instance=instance,
        channel="location_heatmap",
        recipe_id="image_grid_onehot@1",
        min_crowd_size=100_000,
        origin=format_origins(origin_ids(np.arange(n), seed)),
        event_time_ms=rng.integers(0, 2**45, n) >> rng.integers(0, 45, n),
        payloads=payloads,
        payload_crc32c=crc32c_many(payloads),
        crowd_id=crowd_id,
    )


@pytest.mark.parametrize("crowd_id", [None, "de-CH"])
def test_report_encoding_is_byte_identical_to_fastavro(crowd_id):
    batch = random_batch(500, seed=1, crowd_id=crowd_id)
    encoded = encode_report_records(batch)
    schema = parsed_schema(REPORT)
    for index, record in enumerate(batch.to_records()):
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, schema, record)
        assert (
            encoded.data[encoded.offsets[index] : encoded.offsets[index + 1]].tobytes()
            == expected.getvalue()
        )


def test_report_batches_convert_to_arrow_columns_of_the_report_schema():
    from schemas.avro.columns import arrow_schema

    for crowd_id in (None, "de-CH"):
        batch = random_batch(200, seed=4, crowd_id=crowd_id)
        columns = batch.to_arrow()
        assert columns.schema.equals(arrow_schema(schema_json(REPORT)))
        assert columns.to_pylist() == batch.to_records()


def small_plan(**settings) -> SimulationPlan:
    settings.setdefault("respondents", 3000)
    settings.setdefault("messages_per_shard", 60_000)
    settings.setdefault("messages_per_chunk", 20_000)
    return SimulationPlan.for_recipe(
        load_recipe("image_grid_onehot"), "image:disc", seed=21, **settings
    )


def test_shards_cover_the_respondents_with_independent_seeds():
    context = ShardContext(small_plan())
    shards = context.shards()
    assert len(shards) > 1 and shards[0].start == 0 and shards[-1].stop == 3000
    assert all(a.stop == b.start for a, b in zip(shards[:-1], shards[1:], strict=True))
    draws = {shard.generator(0).integers(2**62) for shard in shards}
    assert len(draws) == len(shards)


def test_report_batches_split_by_instance_with_presence_and_valid_crcs():
    context = ShardContext(small_plan(respondents=400))
    shard = context.shards()[0]
    chunks = [item for item in simulate_shard(context, shard) if not isinstance(item, ShardSummary)]
    summary = list(simulate_shard(context, shard))[-1]
    batches = [batch for _, chunk in chunks for batch in chunk]
    per_instance = np.bincount(
        [b.shuffler_instance for b in batches], weights=[len(b) for b in batches]
    )
    assert np.array_equal(per_instance, summary.messages + summary.presence)
    assert summary.presence.tolist() == [shard.respondents] * 4
    records = [r for batch in batches for r in batch.to_records()]
    assert all(crc32c(r["payload"]) == r["payload_crc32c"] for r in records)
    assert all(r["recipe_id"] == "image_grid_onehot@1" for r in records)
    presence = [r for r in records if r["payload"] == b""]  # empty payload, CRC32C 0
    assert len(presence) == summary.presence.sum()
    assert all(r["payload_crc32c"] == 0 for r in presence)
    assert not [r for r in records if r["payload"] == b"\x00"]  # no retired census payload
    for instance in range(4):
        origins = {r["origin"] for r in presence if r["shuffler_instance"] == instance}
        assert len(origins) == shard.respondents


def test_written_shards_are_reproducible_and_retries_overwrite(tmp_path):
    plan = small_plan(respondents=800)
    context = ShardContext(plan)
    shard = context.shards()[0]
    first = write_shard(context, shard, str(tmp_path / "a"))
    write_shard(ShardContext(plan), shard, str(tmp_path / "b"))
    write_shard(ShardContext(plan), shard, str(tmp_path / "b"))  # a retry rewrites the same file
    for instance in range(4):
        name = shard_file_name(instance, shard.index)
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        with open(tmp_path / "a" / name, "rb") as handle:
            count = sum(1 for _ in fastavro.reader(handle))
        assert count == first.messages[instance] + first.presence[instance]


def test_summaries_combine_the_same_sequentially_and_by_merging_partials():
    context = ShardContext(small_plan())
    summaries = [list(simulate_shard(context, shard))[-1] for shard in context.shards()]
    combine = CombineShardSummaries()
    sequential = combine.create_accumulator()
    for summary in summaries:
        sequential = combine.add_input(sequential, summary)
    halves = [combine.create_accumulator(), combine.create_accumulator()]
    for index, summary in enumerate(summaries):
        halves[index % 2] = combine.add_input(halves[index % 2], summary)
    merged = combine.extract_output(combine.merge_accumulators(halves))
    for result in (sequential, merged):
        assert result.respondents == 3000 and result.truth_count.sum() == 3000
        assert result.shards == len(summaries)
    assert np.array_equal(sequential.truth_count, merged.truth_count)
    assert np.array_equal(sequential.messages, merged.messages)
    counts = context.population.exact_counts()
    assert np.array_equal(merged.truth_bucket, np.flatnonzero(counts))
    assert np.array_equal(merged.truth_count, counts[counts > 0])


def test_encode_reports_transform_yields_report_batches_and_summaries():
    plan = small_plan(respondents=600, messages_per_shard=15_000)
    shards = ShardContext(plan).shards()
    with test_pipeline.TestPipeline(runner="FnApiRunner") as pipeline:
        outputs = pipeline | beam.Create(shards) | EncodeReports(plan)
        records = (
            outputs.reports
            | "Records" >> beam.Map(lambda batch: (batch.shuffler_instance, len(batch)))
            | beam.CombinePerKey(sum)
        )
        totals = (
            outputs.summary
            | beam.CombineGlobally(CombineShardSummaries())
            | beam.FlatMap(lambda s: list(enumerate((s.messages + s.presence).tolist())))
        )
        respondents = (
            outputs.summary
            | "Respondents" >> beam.Map(lambda s: s.respondents)
            | "Sum" >> beam.CombineGlobally(sum)
        )
        assert_that(respondents, equal_to([600]), label="respondents")
        joined = (
            {"records": records, "totals": totals}
            | beam.CoGroupByKey()
            | beam.Map(lambda kv: kv[1]["records"] == kv[1]["totals"])
        )
        assert_that(joined, equal_to([True] * 4), label="per instance")
