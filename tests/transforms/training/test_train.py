"""LDP-SGD Beam transforms: device shards write Report files; the server sums and steps."""

from __future__ import annotations

import glob

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that

from schemas import REPORT, schema_json
from schemas.avro.crc32c import crc32c_many
from schemas.ldp_sgd import SgdChannel, encode_sgd_payloads
from simulators.sgd_data import load_device_data
from simulators.sgd_devices import EpochPlan, reference_epoch
from transforms.common.avro_io import ColumnBatch, read_avro_batches
from transforms.training.epochs import (
    AggregateEpoch,
    DirectionSum,
    SumDirections,
    WriteEpochReports,
    decode_batch,
)

OPTIONS = PipelineOptions(["--runner=FnApiRunner"])


def _channel(data, epoch=1, instances=2):
    return SgdChannel("synthetic:300", epoch, 1.5, 1.0, data.dimension, instances, 1, 10)


def test_decode_batch_counts_every_rejected_message():
    data = load_device_data("synthetic:300", seed=2)
    channel = _channel(data)
    rng = np.random.default_rng(0)
    payloads = encode_sgd_payloads(
        rng.integers(0, 256, size=(5, 16), dtype=np.uint8), np.array([1, -1, 1, 1, -1])
    ).to_pylist()
    payloads[3] = payloads[3][:-2]  # wrong length, correct CRC of the short bytes
    crc = crc32c_many(payloads).astype(np.int64)
    crc[4] ^= 1
    columns = pa.RecordBatch.from_pydict({
        "recipe_id": [channel.recipe_id] * 4 + ["other@1"] + [channel.recipe_id],
        "channel": [channel.channel] * 6,
        "payload": pa.array(payloads + [payloads[0]], type=pa.binary()),
        "payload_crc32c": np.append(crc, crc[0]),
    })  # fmt: skip
    randomizer = EpochPlan(1, 1.5, 1.0, data.dimension).randomizer
    part = decode_batch(columns, channel, randomizer)
    assert part.read == 6 and part.reports == 4
    assert part.rejected == {"wrong_recipe": 1, "bad_payload_length": 1}
    columns = columns.set_column(3, "payload_crc32c", pa.array(np.append(crc, crc[0] ^ 1)))
    part = decode_batch(columns, channel, randomizer)
    assert part.rejected == {"wrong_recipe": 1, "bad_payload_length": 1, "bad_crc32c": 1}
    assert part.reports == 3
    assert part.read == part.reports + sum(part.rejected.values())


def test_sum_directions_merges_like_sequential_adds():
    combine = SumDirections(3)
    parts = [DirectionSum(np.array([1.0, 2, 3]), 2, 3, {"x": 1}),
             DirectionSum(np.array([0.5, 0, -1]), 1, 1, {}),
             DirectionSum(np.array([0.0, 1, 0]), 4, 5, {"x": 1, "y": 0})]  # fmt: skip
    sequential = combine.create_accumulator()
    for part in parts:
        sequential = combine.add_input(sequential, part)
    a = combine.add_input(combine.create_accumulator(), parts[0])
    b = combine.add_input(combine.add_input(combine.create_accumulator(), parts[1]), parts[2])
    merged = combine.extract_output(combine.merge_accumulators([a, b]))
    np.testing.assert_array_equal(merged.total, sequential.total)
    assert (merged.reports, merged.read, merged.rejected) == (7, 9, {"x": 2, "y": 0})


def test_device_reports_through_the_server_match_the_numpy_epoch(tmp_path):
    data = load_device_data("synthetic:300", seed=2)
    plan = EpochPlan(2, 1.5, 1.0, data.dimension, instances=2, seed=5, devices_per_shard=128)
    channel = _channel(data, epoch=2)
    theta = np.random.default_rng(1).normal(size=data.dimension) * 0.05
    with beam.Pipeline(options=OPTIONS) as pipeline:
        counts = (
            pipeline
            | beam.Create(plan.shards(data.devices))
            | WriteEpochReports("synthetic:300", 2, plan, channel, theta, str(tmp_path), 0)
        )
        assert_that(
            counts | beam.Map(lambda c: c["reports"]) | beam.CombineGlobally(sum),
            lambda totals: totals == [300] or (_ for _ in ()).throw(AssertionError(totals)),
        )
    files = sorted(glob.glob(str(tmp_path / "instance=*" / "*.avro")))
    assert len(files) == 6  # 3 shards x 2 instances
    batches = [b for f in files for b in read_avro_batches(f)]
    assert all(isinstance(b, ColumnBatch) for b in batches)
    origins = {o for b in batches for o in b.columns.column("origin").to_pylist()}
    assert len(origins) == 300
    # The server reads the same columns from any file that has them (here the Report files).
    expected = reference_epoch(data, plan, theta, radius=3.0)
    with beam.Pipeline(options=OPTIONS) as pipeline:
        updates = (
            pipeline
            | beam.Create(files)
            | AggregateEpoch(channel, plan.randomizer, theta, radius=3.0)
        )

        def check(results):
            (update,) = results
            assert update.reports == 300 and update.read == 300 and update.adds_up
            np.testing.assert_allclose(update.theta, expected.theta, rtol=0, atol=1e-12)
            assert update.learning_rate == expected.learning_rate

        assert_that(updates, check)


def test_rejected_messages_become_dead_letters(tmp_path):
    from schemas import DEAD_LETTER, SHUFFLED_MESSAGE, parsed_schema, schema_json
    from schemas.dead_letters import dead_letter
    from transforms.common.avro_io import read_avro_batches as read_batches
    from transforms.common.avro_io import write_avro, write_avro_columns
    from transforms.training.epochs import dead_letter_file_name

    data = load_device_data("synthetic:300", seed=2)
    channel = _channel(data)
    rng = np.random.default_rng(3)
    payloads = encode_sgd_payloads(
        rng.integers(0, 256, size=(8, 16), dtype=np.uint8), rng.choice([-1, 1], size=8)
    ).to_pylist()
    payloads[2] = b"\xe5" + payloads[2][1:-1] + b"\x00"  # bad sign byte
    crc = crc32c_many(payloads).astype(np.int64)
    crc[5] ^= 7
    released = str(tmp_path / "part-0.avro")
    write_avro_columns(
        released,
        schema_json(SHUFFLED_MESSAGE),
        {
            "schema_version": 1,
            "window_start": 0,
            "window_end": 1,
            "channel": channel.channel,
            "recipe_id": pa.array([channel.recipe_id] * 7 + ["other@1"]),
            "crowd_id": None,
            "payload": pa.array(payloads, type=pa.binary()),
            "payload_crc32c": crc,
        },
        8,
    )
    # A file of another schema (no payload field) is one schema_mismatch chunk of its 2 records.
    foreign = str(tmp_path / "foreign.avro")
    write_avro(foreign, parsed_schema(DEAD_LETTER), [dead_letter("x", "y", "z", "w")] * 2)
    randomizer = EpochPlan(1, 1.5, 1.0, data.dimension).randomizer
    letters_dir = tmp_path / "dead"
    letters_dir.mkdir()
    theta = np.zeros(data.dimension)
    with beam.Pipeline(options=OPTIONS) as pipeline:
        updates = (
            pipeline
            | beam.Create([released, foreign])
            | AggregateEpoch(channel, randomizer, theta, 2.0, str(letters_dir))
        )

        def check(results):
            (update,) = results
            assert (update.read, update.reports) == (10, 5) and update.adds_up
            assert update.rejected == {
                "bad_payload_sign": 1,
                "bad_crc32c": 1,
                "wrong_recipe": 1,
                "schema_mismatch": 2,
            }

        assert_that(updates, check)
    (batch,) = list(read_batches(str(letters_dir / dead_letter_file_name(released))))
    letters = batch.columns.to_pylist()
    assert [(d["reason"], d["source"].rsplit(" ", 1)[1]) for d in letters] == [
        ("bad_payload_sign", "2"),
        ("bad_crc32c", "5"),
        ("wrong_recipe", "7"),
    ]
    assert letters[0]["original_bytes"] == payloads[2]
    assert all(d["stage"] == "train.server" for d in letters)
    (batch,) = list(read_batches(str(letters_dir / dead_letter_file_name(foreign))))
    assert batch.columns.column("reason").to_pylist() == ["schema_mismatch"]


def test_a_file_that_is_no_avro_breaks_the_balance_and_is_dead_lettered(tmp_path):
    from transforms.training.epochs import _DecodeFileFn, _update, dead_letter_file_name

    data = load_device_data("synthetic:300", seed=2)
    randomizer = EpochPlan(1, 1.5, 1.0, data.dimension).randomizer
    garbage = tmp_path / "garbage.avro"
    garbage.write_bytes(b"not an avro file at all")
    (tmp_path / "dead").mkdir()
    fn = _DecodeFileFn(_channel(data), randomizer, str(tmp_path / "dead"))
    parts = list(fn.process(str(garbage)))
    total = SumDirections(data.dimension).create_accumulator()
    for part in parts:
        total.add(part)
    update = _update(total, np.zeros(data.dimension), 1, randomizer, 1.0)
    assert update.unknown_chunks == 1 and update.reports == 0 and not update.adds_up
    assert (tmp_path / "dead" / dead_letter_file_name(str(garbage))).exists()


def test_sealed_epoch_reports_open_to_the_same_update_and_tampering_is_rejected(tmp_path):
    import fastavro

    from schemas.crypto import sealing
    from schemas.crypto.analyzer_keys import generate_key, write_key_pair
    from transforms.common.avro_io import write_avro_columns
    from transforms.training.epochs import SGD_PAD_LENGTH

    key = generate_key()
    write_key_pair(key, tmp_path / "keys")
    data = load_device_data("synthetic:300", seed=2)
    plan = EpochPlan(2, 1.5, 1.0, data.dimension, instances=1, seed=5, devices_per_shard=300)
    channel = _channel(data, epoch=2, instances=1)
    theta = np.random.default_rng(1).normal(size=data.dimension) * 0.05
    day = 86_400_000
    with beam.Pipeline(options=OPTIONS) as pipeline:
        _ = (
            pipeline
            | beam.Create(plan.shards(data.devices))
            | WriteEpochReports(
                "synthetic:300", 2, plan, channel, theta, str(tmp_path / "r"), 3 * day + 5,
                public_key_json=key.public.to_json(),
            )
        )  # fmt: skip
    (path,) = glob.glob(str(tmp_path / "r" / "instance=0" / "*.avro"))
    with open(path, "rb") as handle:
        records = list(fastavro.reader(handle))
    assert {len(r["payload"]) for r in records} == {sealing.sealed_length(SGD_PAD_LENGTH)}
    expected = reference_epoch(data, plan, theta, radius=3.0)
    ring = str(tmp_path / "keys")

    def check(expect_reports, rejected):
        def inner(results):
            (update,) = results
            assert update.read == 300 and update.adds_up
            assert (update.reports, update.rejected) == (expect_reports, rejected)
            if expect_reports == 300:  # sealing is transparent to Algorithm 5
                np.testing.assert_allclose(update.theta, expected.theta, rtol=0, atol=1e-12)

        return inner

    sealed = {"key_ring": ring, "event_time_ms": 3 * day}
    with beam.Pipeline(options=OPTIONS) as pipeline:
        updates = (
            pipeline
            | beam.Create([path])
            | AggregateEpoch(channel, plan.randomizer, theta, radius=3.0, **sealed)
        )
        assert_that(updates, check(300, {}))
    # One flipped ciphertext byte (with a CRC32C that matches) is one sealed_open_failed; a
    # server without the key ring refuses every sealed payload.
    payloads = [r["payload"] for r in records]
    payloads[7] = payloads[7][:30] + bytes([payloads[7][30] ^ 1]) + payloads[7][31:]
    tampered = str(tmp_path / "tampered.avro")
    write_avro_columns(
        tampered,
        schema_json(REPORT),
        {**{k: pa.array([r[k] for r in records]) for k in records[0] if k != "payload"},
         "payload": pa.array(payloads, pa.binary()),
         "payload_crc32c": crc32c_many(payloads).astype(np.int64)},
        len(records),
    )  # fmt: skip
    for files, options, reports, rejected in (
        ([tampered], sealed, 299, {"sealed_open_failed": 1}),
        ([path], {}, 0, {"sealed_without_key_ring": 300}),
    ):
        with beam.Pipeline(options=OPTIONS) as pipeline:
            updates = (
                pipeline
                | beam.Create(files)
                | AggregateEpoch(channel, plan.randomizer, theta, radius=3.0, **options)
            )
            assert_that(updates, check(reports, rejected))


def test_the_server_reads_only_the_files_of_the_verified_commit_record(tmp_path):
    import hashlib
    import json

    from transforms.training.epochs import CommittedMessageFiles

    release = tmp_path / "instance=0"
    (release / "messages").mkdir(parents=True)
    (release / "crowds").mkdir()
    for name in ("messages/a-g0.avro", "messages/stray.avro", "crowds/a.avro"):
        (release / name).write_bytes(b"")
    commit = release / "_COMMIT.json"
    commit.write_text(json.dumps({"format": "esa-release/2", "files": [
        {"path": "messages/a-g0.avro"}, {"path": "crowds/a.avro"}]}))  # fmt: skip
    pinned = (0, str(release), hashlib.sha256(commit.read_bytes()).hexdigest())
    with beam.Pipeline(options=OPTIONS) as pipeline:
        paths = pipeline | beam.Create([pinned]) | CommittedMessageFiles()
        # The committed message file only: no stray file beside it, no crowd table.
        assert_that(paths, lambda got: got == [str(release / "messages" / "a-g0.avro")])
    # A record changed after it was verified (here: one more file listed) is refused.
    commit.write_text(json.dumps({"format": "esa-release/2", "files": [
        {"path": "messages/a-g0.avro"}, {"path": "messages/stray.avro"}]}))  # fmt: skip
    with pytest.raises(Exception, match="not the commit record that was verified"):
        with beam.Pipeline(options=OPTIONS) as pipeline:
            _ = pipeline | beam.Create([pinned]) | CommittedMessageFiles()
    commit.unlink()  # and a missing one
    with pytest.raises(Exception, match="_COMMIT.json"):
        with beam.Pipeline(options=OPTIONS) as pipeline:
            _ = pipeline | beam.Create([pinned]) | CommittedMessageFiles()
