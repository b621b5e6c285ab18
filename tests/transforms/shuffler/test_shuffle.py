"""The shuffler's Beam transforms end to end on small inputs (transforms/shuffler/shuffle.py)."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import fastavro
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from scipy import stats

from schemas import parsed_schema, schema_json
from schemas.release.crowd_buckets import crowd_bucket, crowd_order, parse_release_path
from tests.transforms import report_factory as rf
from transforms.common.dead_letters import WriteDeadLetters
from transforms.shuffler import decide, report_rows, sinks
from transforms.shuffler import shuffle as sh

SHUFFLED_FIELDS = {field["name"] for field in schema_json("shuffled_message")["fields"]}
# Reasons of the read stage: one dead letter holds all records of a chunk.
READ_REASONS = ("corrupt_block", "schema_mismatch")


@dataclasses.dataclass
class Release:
    files: dict[str, list[dict[str, Any]]]  # message file -> records in file order
    crowds: dict[str, list[dict[str, Any]]]  # crowd table -> ReleasedCrowd records
    manifests: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    metrics: dict[str, Any]
    counters: dict[str, int]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [record for records in self.files.values() for record in records]


def _read(path: str) -> list[dict[str, Any]]:
    with open(path, "rb") as handle:
        return list(fastavro.reader(handle))


def _collect(output: Path, private: Path, streaming: bool, result: Any) -> Release:
    files = {path: _read(path) for path in sorted(glob.glob(str(output / "messages" / "*.avro")))}
    crowds = {path: _read(path) for path in sorted(glob.glob(str(output / "crowds" / "*.avro")))}
    manifest_paths = glob.glob(str(private / "manifest" / "**" / "*.avro"), recursive=True)
    manifests = [record for path in manifest_paths for record in _read(path)]
    letters = [
        record
        for path in glob.glob(str(private / "dead_letter" / "*.avro"))
        for record in _read(path)
    ]
    metrics = json.loads((private / "metrics.json").read_text())
    counters = {}
    for counter in result.metrics().query()["counters"]:
        counters[counter.key.metric.name] = (
            counters.get(counter.key.metric.name, 0) + counter.committed
        )
    return Release(files, crowds, manifests, letters, metrics, counters)


def _pipeline(
    pipeline: beam.Pipeline, source: Any, output: Path, private: Path, config: sh.ShuffleConfig
) -> None:
    outputs = pipeline | source | sh.ShuffleReports(config, str(private / "spill" / "run"))
    outputs.released | sinks.WriteShuffledMessages(str(output), str(private))
    outputs.crowds | sinks.WriteCrowdTables(str(output), str(private))
    outputs.dead_letters | WriteDeadLetters(str(private))
    outputs.manifests | sinks.WriteManifests(str(private), config.streaming)
    outputs.counts | sinks.WriteMetrics(str(private), config.streaming)


def _run(tmp_path: Path, paths: list[str], config: sh.ShuffleConfig) -> Release:
    output, private = tmp_path / "out", tmp_path / "out.private"
    pipeline = beam.Pipeline(options=PipelineOptions(runner="FnApiRunner"))
    _pipeline(pipeline, beam.Create(paths), output, private, config)
    result = pipeline.run()
    result.wait_until_finish()
    return _collect(output, private, False, result)


def _config(**overrides: Any) -> sh.ShuffleConfig:
    values: dict[str, Any] = {
        "rules": rf.rules(),
        "crowd_threshold": 12,
        "batch_records": 64,
        "messages_per_shard": 40,
        "messages_per_file": 16,
        "shard_piece_rows": 1,  # small inputs still split into shards
    }
    values.update(overrides)
    return sh.ShuffleConfig(**values)


def _crowd_of(record: dict[str, Any]) -> tuple[Any, ...]:
    window = record["window_start"]
    window = int(window.timestamp() * 1000) if hasattr(window, "timestamp") else window
    return (window, record["channel"], record["recipe_id"], record["crowd_id"])


def _check_layout(release: Release, buckets: int) -> None:
    """esa-release/2: a message file holds only crowds of its bucket, grouped by crowd in
    crowd_order; a crowd table per bucket decided, strictly in crowd_order, stating each
    released crowd's messages; no crowd in two tables."""
    tables = {}
    for path, records in release.crowds.items():
        _, key, _ = parse_release_path("crowds/" + os.path.basename(path))
        orders = [crowd_order(r["channel"], r["recipe_id"], r["crowd_id"]) for r in records]
        assert records and orders == sorted(set(orders))
        for record in records:
            assert (_ms(record["window_start"]), record["instance"]) == key[:2]
            bucket = crowd_bucket(
                record["channel"], record["recipe_id"], record["crowd_id"], buckets
            )
            assert bucket == key.bucket
        tables[key] = {_crowd_of(r): r for r in records}
    assert sum(len(table) for table in tables.values()) == len(release.manifests)
    released = Counter()
    for path, records in release.files.items():
        _, key, _ = parse_release_path("messages/" + os.path.basename(path))
        crowds = [_crowd_of(r) for r in records]
        runs = [
            crowd for index, crowd in enumerate(crowds) if index == 0 or crowds[index - 1] != crowd
        ]
        assert len(runs) == len(set(runs))  # grouped by crowd
        assert runs == sorted(runs, key=lambda c: crowd_order(*c[1:]))
        assert all(crowd in tables[key] for crowd in runs)
        released.update((key, crowd) for crowd in crowds)
    for key, table in tables.items():
        for crowd, record in table.items():
            assert released[(key, crowd)] == record["messages_released"]


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


def test_bad_input_is_dead_lettered_and_every_record_is_accounted(tmp_path: Path) -> None:
    released_crowds = {
        "main": rf.crowd(30, 2, prefix="main"),
        # Another recipe in the same channel: its own crowd, never mixed with test@1.
        "other": rf.crowd(25, 1, prefix="other", recipe_id=rf.OTHER_RECIPE),
        "alt": rf.crowd(15, 1, prefix="alt", recipe_id=rf.ALT_RECIPE, channel=rf.ALT_CHANNEL),
    }
    withheld_crowds = {
        # One origin flooding a crowd counts once: 9 + 1 distinct respondents < 12.
        "flood": rf.crowd(9, 1, prefix="fl", crowd_id="flood")
        + [rf.report("flooder", f"f{i}".encode(), crowd_id="flood") for i in range(300)],
        "small": rf.crowd(5, 1, prefix="small", crowd_id="small"),
        # Enough respondents for the configured threshold, but the devices demand 40.
        "demanding": rf.crowd(30, 1, prefix="dem", crowd_id="dem", min_crowd_size=40),
    }
    bad = {
        "crc_mismatch": [rf.report("bad1", b"x", crc=7)],
        "unknown_schema_version": [rf.report("bad2", schema_version=9)],
        "unknown_recipe": [rf.report("bad3", recipe_id="nope@1")],
        "instance_out_of_range": [rf.report("bad5", instance=7)],
        "recipe_channel_mismatch": [rf.report("bad6", recipe_id=rf.ALT_RECIPE)],
        "empty_origin": [rf.report("", b"y")],
    }
    good = [r for crowd in [*released_crowds.values(), *withheld_crowds.values()] for r in crowd]
    bad_records = [r for records in bad.values() for r in records]
    mixed = good + bad_records
    np.random.default_rng(0).shuffle(mixed)
    paths = [rf.write_reports(tmp_path / "reports.avro", mixed)]

    # A file of another schema: dead-lettered whole as schema_mismatch, every record counted.
    with open(tmp_path / "other.avro", "wb") as handle:
        letter = {"stage": "s", "reason": "r", "detail": "", "source": ""}
        fastavro.writer(handle, parsed_schema("dead_letter"), [letter] * 3)
    paths.append(str(tmp_path / "other.avro"))
    # A writer schema whose channel is a union of string and long: dead-lettered whole too.
    union = dict(schema_json("report"))
    union["fields"] = [
        {**field, "type": ["string", "long"]} if field["name"] == "channel" else field
        for field in union["fields"]
    ]
    with open(tmp_path / "union.avro", "wb") as handle:
        two = [rf.report("u1"), {**rf.report("u2"), "channel": 7}]
        fastavro.writer(handle, fastavro.parse_schema(union), two)
    paths.append(str(tmp_path / "union.avro"))
    # A file with a corrupt block (its header declares how many records it held).
    corrupt = bytearray(
        rf.report_bytes(rf.crowd(400, 1, prefix="corr", crowd_id="corr"), sync_interval=2000)
    )
    corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 30] = b"\xff" * 30
    (tmp_path / "corrupt.avro").write_bytes(bytes(corrupt))
    paths.append(str(tmp_path / "corrupt.avro"))

    # Two buckets for seven crowds: files and crowd tables hold several crowds.
    release = _run(tmp_path, paths, _config(crowd_buckets=2))
    metrics = release.metrics

    # Accounting: read = released + deleted + withheld + dead-lettered, in data and Beam counters.
    assert metrics["adds_up"] and metrics["read"] == metrics["accounted"]
    rejected = metrics["rejected_by_reason"]
    for reason, records in bad.items():
        assert rejected[reason] == len(records), reason
    assert rejected["schema_mismatch"] == 3 + 2
    # The damaged blocks are counted in the records their headers declare.
    assert rejected["corrupt_block"] >= 8
    assert metrics["chunks_of_unknown_records"] == {}
    counters = release.counters
    assert counters["read"] == metrics["read"] and counters["released"] == metrics["released"]
    assert (
        sum(v for k, v in counters.items() if k.startswith("rejected_")) == metrics["dead_lettered"]
    )

    # Every rejected record is in the dead-letter output with its reason and where it came from
    # (one letter per record; one per unreadable chunk, which counts the records it held).
    letters = release.dead_letters
    per_record = [letter for letter in letters if letter["stage"] != sh.STAGE_READ]
    assert Counter(letter["reason"] for letter in per_record) == Counter(
        {reason: n for reason, n in rejected.items() if reason not in READ_REASONS}
    )
    read_letters = {letter["reason"] for letter in letters if letter["stage"] == sh.STAGE_READ}
    assert read_letters == set(READ_REASONS)
    by_origin = {
        json.loads(letter["original_record"])["origin"]: letter["reason"]
        for letter in letters
        if letter["stage"] == sh.STAGE_VALIDATE and letter["reason"] != "wrong_schema"
    }
    assert by_origin == {records[0]["origin"]: reason for reason, records in bad.items()}
    assert all(letter["source"] and letter["detail"] for letter in letters)
    assert all(letter["original_bytes"] for letter in letters if letter["stage"] == sh.STAGE_READ)

    # Exactly the crowds at or above their threshold are released, whole and unmixed.
    released_payloads = Counter(
        (m["recipe_id"], m["crowd_id"], m["payload"]) for m in release.messages
    )
    expected = Counter(
        (r["recipe_id"], r["crowd_id"], r["payload"])
        for crowd in released_crowds.values()
        for r in crowd
    )
    readable_trunc = {m for m in released_payloads if m[1] == "corr"}
    for key in readable_trunc:  # what survived of the damaged files is released too
        expected[key] = released_payloads[key]
    assert released_payloads == expected
    assert not {m["crowd_id"] for m in release.messages} & {"flood", "small", "dem"}
    assert all(set(r) == SHUFFLED_FIELDS for records in release.files.values() for r in records)
    _check_layout(release, 2)

    manifests = {(m["recipe_id"], m["crowd_id"]): m for m in release.manifests}
    assert manifests[(rf.RECIPE, "flood")]["respondents"] == 10
    assert manifests[(rf.RECIPE, "flood")]["messages_in"] == 309
    assert manifests[(rf.RECIPE, "dem")]["threshold"] == 40
    for key in [(rf.RECIPE, "flood"), (rf.RECIPE, "small"), (rf.RECIPE, "dem")]:
        assert manifests[key]["status"] == "WITHHELD"
        assert manifests[key]["withheld_reason"] == decide.BELOW_THRESHOLD
    assert manifests[(rf.RECIPE, None)]["respondents"] == 30
    assert manifests[(rf.RECIPE, None)]["messages_released"] == 60
    assert manifests[(rf.OTHER_RECIPE, None)]["status"] == "RELEASED"
    assert sum(m["messages_released"] for m in release.manifests) == metrics["released"]
    assert (
        sum(m["messages_in"] for m in release.manifests if m["status"] == "WITHHELD")
        == metrics["withheld"]
    )


def test_unreadable_bytes_of_unknown_record_count_do_not_add_up(tmp_path: Path) -> None:
    """A truncated file's tail and bytes that are no Avro at all hold records nobody can count:
    metrics say so (``adds_up`` false) instead of counting them as one record each."""
    whole = rf.report_bytes(rf.crowd(400, 1, prefix="t", crowd_id="t"), sync_interval=2000)
    (tmp_path / "truncated.avro").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "garbage.avro").write_bytes(b"\x00not avro\x01" * 10)
    paths = [str(tmp_path / "truncated.avro"), str(tmp_path / "garbage.avro")]
    release = _run(tmp_path, paths, _config())
    metrics = release.metrics
    assert metrics["chunks_of_unknown_records"].get("unreadable_file") == 1
    assert not metrics["adds_up"]
    assert metrics["read"] == metrics["accounted"]  # what could be counted balances
    assert {letter["reason"] for letter in release.dead_letters} >= {"unreadable_file"}


def test_deletion_drops_whole_respondents_and_the_manifest_says_so(tmp_path: Path) -> None:
    # Two crowds in one bucket (B = 1) over 16 origin shards: each crowd decided on its own.
    records = rf.crowd(300, 3, prefix="d") + rf.crowd(280, 3, prefix="e", crowd_id="e")
    path = rf.write_reports(tmp_path / "r.avro", records)
    # delta_cr = 1e-9: a crowd is withheld (abort, Theorem V.1) with probability <= 5e-10, and
    # below the threshold after deletion (Z < -225 at scale 2) with probability < 1e-45: the test
    # asserts the release. The withheld branches are checked exactly in test_release_core.py.
    config = _config(
        deletion=report_rows.DeletionParameters(1.0, 1e-9), messages_per_shard=100, crowd_buckets=1
    )
    release = _run(tmp_path, [path], config)
    assert release.metrics["adds_up"] and len(release.manifests) == 2
    (table_rows,) = release.crowds.values()
    table = {row["crowd_id"]: row for row in table_rows}
    _check_layout(release, 1)
    for manifest in release.manifests:
        assert manifest["status"] == "RELEASED", manifest
        crowd_id = manifest["crowd_id"]
        messages = [m for m in release.messages if m["crowd_id"] == crowd_id]
        per_origin = Counter(m["payload"].split(b"/")[0] for m in messages)
        assert set(per_origin.values()) == {3}  # a respondent is released whole or not at all
        kept = manifest["respondents"] - manifest["respondents_deleted"]
        assert len(per_origin) == kept
        assert manifest["messages_deleted"] == 3 * manifest["respondents_deleted"]
        assert manifest["messages_released"] == len(messages) == 3 * kept
        # Algorithm 3: n - n_hat = offset - Z; |Z| > 40 has probability < 1e-8 at scale 2.
        assert abs(manifest["respondents_deleted"] - config.deletion.offset) <= 40
        # The crowd table states the respondents released, from the same decision.
        crowd = table[crowd_id]
        assert crowd["respondents_released"] == kept and crowd["messages_released"] == 3 * kept
    assert release.metrics["deleted"] == sum(m["messages_deleted"] for m in release.manifests)


def test_release_order_and_fields_do_not_depend_on_arrival_origin_or_time(tmp_path: Path) -> None:
    count = 3000
    payloads = [f"m{i:05d}".encode() for i in range(count)]
    # The same payloads reach instance 0 and instance 1 from different origins at different
    # times of the same window; the instance is stripped, so both releases must be identical.
    first = [
        rf.report(f"a{i}", p, instance=0, event_time=rf.T0 + i) for i, p in enumerate(payloads)
    ]
    second = [
        rf.report(f"b{(i * 7) % count}", p, instance=1, event_time=rf.T0 + rf.DAY_MS - 1 - i)
        for i, p in enumerate(payloads)
    ]
    path = rf.write_reports(tmp_path / "r.avro", first + second)
    release = _run(tmp_path, [path], _config(messages_per_file=10_000, messages_per_shard=1000))
    assert release.metrics["released"] == 2 * count
    files = list(release.files.values())
    assert len(files) == 2
    # Both files hold the same records; the window is all that time leaves behind.
    assert sorted(tuple(sorted(r.items())) for r in files[0]) == sorted(
        tuple(sorted(r.items())) for r in files[1]
    )
    assert {_crowd_of(r)[0] for r in files[0]} == {rf.T0}
    for records in files:
        arrival = [int(r["payload"][1:]) for r in records]
        rho = stats.spearmanr(np.arange(count), arrival).statistic
        assert abs(rho) < 4.5 / math.sqrt(count - 1)  # 4.5 sigma: ~7e-6 per check
    # The two releases are independent permutations of each other.
    position = {r["payload"]: index for index, r in enumerate(files[1])}
    rho = stats.spearmanr(np.arange(count), [position[r["payload"]] for r in files[0]]).statistic
    assert abs(rho) < 4.5 / math.sqrt(count - 1)


def test_crowds_of_a_bucket_share_files_grouped_in_crowd_order_each_uniformly_permuted(
    tmp_path: Path,
) -> None:
    """One bucket (B = 1), three crowds sent interleaved, two groups: every file holds the
    crowds in crowd_order, and each crowd's rows are in an order unrelated to arrival."""
    count = 600
    crowd_ids = ["b", None, "a"]
    records = [
        rf.report(f"{crowd}-{i}", f"{crowd}/{i:04d}".encode(), crowd_id=crowd)
        for i in range(count)
        for crowd in crowd_ids
    ]
    path = rf.write_reports(tmp_path / "r.avro", records)
    config = _config(crowd_buckets=1, messages_per_file=1000, messages_per_shard=700)
    release = _run(tmp_path, [path], config)
    assert release.metrics["released"] == 3 * count and len(release.files) == 2
    assert len(release.crowds) == 1
    _check_layout(release, 1)
    for records_in_file in release.files.values():
        crowds = [r["crowd_id"] for r in records_in_file]
        runs = [c for index, c in enumerate(crowds) if index == 0 or crowds[index - 1] != c]
        assert runs == [None, "a", "b"]
        for crowd in runs:
            arrival = [int(r["payload"].split(b"/")[1]) for r in records_in_file
                       if r["crowd_id"] == crowd]  # fmt: skip
            rho = stats.spearmanr(np.arange(len(arrival)), arrival).statistic
            # 4.5 sigma per check (~7e-6), six checks: false failure < 1e-4.
            assert abs(rho) < 4.5 / math.sqrt(len(arrival) - 1)


def test_single_instance_run_rejects_other_instances(tmp_path: Path) -> None:
    records = rf.crowd(20, 1, instance=1) + rf.crowd(20, 1, prefix="zero", instance=0)
    path = rf.write_reports(tmp_path / "r.avro", records)
    release = _run(tmp_path, [path], _config(rules=rf.rules(instance=1)))
    assert release.metrics["rejected_by_reason"] == {"wrong_instance": 20}
    assert release.metrics["released"] == 20 and release.metrics["adds_up"]
    assert {m["shuffler_instance"] for m in release.manifests} == {1}


def test_streaming_windows_with_watermark_and_late_data(tmp_path: Path) -> None:
    on_time = rf.write_reports(tmp_path / "1.avro", rf.crowd(5, 2, prefix="on"))
    later = rf.write_reports(
        tmp_path / "2.avro",
        rf.crowd(3, 1, prefix="late")
        + rf.crowd(6, 1, prefix="next", event_time=rf.T0 + rf.DAY_MS + 5),
    )
    output, private = tmp_path / "out", tmp_path / "out.private"
    config = _config(crowd_threshold=2, streaming=True)
    stream = (
        BeamTestStream()
        .add_elements([on_time])
        .advance_watermark_to((rf.T0 + rf.DAY_MS + 1000) / 1000)  # the first window is released
        .add_elements([later])  # 3 reports for the first window arrive late
        .advance_watermark_to_infinity()
    )
    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True))
    _pipeline(pipeline, stream, output, private, config)
    result = pipeline.run()
    result.wait_until_finish()
    release = _collect(output, private, True, result)

    assert release.metrics["adds_up"] and release.metrics["read"] == 19
    assert release.metrics["rejected_by_reason"] == {report_rows.LATE_DATA: 3}
    # Late letters point to their input records; the spill never held plaintext origins.
    late = [json.loads(letter["original_record"]) for letter in release.dead_letters]
    assert all("origin" not in record and len(record["origin_hash"]) == 16 for record in late)
    assert sorted(letter["source"] for letter in release.dead_letters) == [
        f"{later}#record={index}" for index in range(3)
    ]
    assert Counter(_crowd_of(m)[0] for m in release.messages) == {rf.T0: 10, rf.T0 + rf.DAY_MS: 6}
    assert sorted(m["respondents"] for m in release.manifests) == [5, 6]


def test_presence_messages_count_respondents_and_are_never_released(tmp_path: Path) -> None:
    """SPEC: an empty payload is a presence message. Respondents whose report sent nothing to
    this instance still count towards the threshold; presence messages are never released; an
    old device's census payload is an ordinary data message; extras are dead-lettered."""
    data = rf.crowd(8, 1, prefix="data")
    presence = [rf.report(f"data-{i}", b"") for i in range(8)]  # one each, with their data
    presence_only = [rf.report(f"quiet-{i}", b"") for i in range(6)]  # nothing else to send
    repeated = [rf.report("data-0", b"") for _ in range(3)]  # duplicate_presence
    census = [rf.report("old-device", b"census-payload"), rf.report("old-device", b"v")]
    routes = dict(
        rf.ROUTES, **{rf.RECIPE: report_rows.RecipeRoute(rf.CHANNEL, 2, origin_caps=(1, 1))}
    )
    rules = report_rows.ValidationRules(routes, frozenset({1}))
    path = rf.write_reports(
        tmp_path / "r.avro", data + presence + presence_only + repeated + census
    )
    release = _run(tmp_path, [path], _config(rules=rules, crowd_threshold=15))
    metrics = release.metrics
    assert metrics["adds_up"] and metrics["read"] == 8 + 8 + 6 + 3 + 2
    assert metrics["presence"] == 14
    assert metrics["rejected_by_reason"] == {"duplicate_presence": 3, "over_origin_cap": 1}
    (manifest,) = release.manifests
    # 8 + 6 + 1 = 15 distinct respondents: released only because presence-only devices count.
    assert manifest["respondents"] == 15 and manifest["status"] == "RELEASED"
    assert manifest["messages_in"] == 9 and metrics["released"] == 9
    assert all(message["payload"] for message in release.messages)
    ((crowd,),) = release.crowds.values()
    assert crowd["respondents_released"] == 15 and crowd["status"] == "released"
    screened = [letter for letter in release.dead_letters if letter["stage"] == sh.STAGE_SCREEN]
    assert sorted(letter["reason"] for letter in screened) == ["duplicate_presence"] * 3 + [
        "over_origin_cap"
    ]
