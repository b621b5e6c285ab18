"""The analyzer's Beam composites: combiner contract and a small pipeline on real Avro files."""

from __future__ import annotations

import json
import pickle

import apache_beam as beam
import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from privacy.rng import seeded_generator
from schemas import SUPPORTED_SCHEMA_VERSIONS, crc32c, parsed_schema
from schemas.payloads import CENSUS, encode_payloads
from schemas.recipes import recipe_from_dict
from transforms.analyzer import arithmetic
from transforms.analyzer.aggregate import (
    AggregateReleases,
    CombineBucket,
    SumCounts,
    metrics_summary,
)
from transforms.analyzer.analyze import AnalysisConfig, EstimateBuckets, TruthSource, WriteAnalysis
from transforms.analyzer.report_files import (
    json_line,
    json_ready,
    pack_lines,
    read_json_parts,
    read_reports,
    read_withheld,
    report_order,
    write_json_part,
)
from transforms.analyzer.tables import (
    WriteTableBatches,
    concat_compact,
    histogram_schema,
    load_batch,
    pack_table,
    sorted_rows,
    spill_batches,
    table_parts,
    write_part,
)
from transforms.common.atomic_files import TEMPORARY_DIR

DAY = 86_400_000
T0 = 1_704_067_200_000
RECIPE = recipe_from_dict(
    {
        "name": "grid",
        "version": 1,
        "channel": "grid",
        "randomizer": "one_hot_rappor",
        "randomizer_params": {"domain_size": 8, "epsilon": 3.0},
        "fragmentation": "attribute",
        "epsilon_local": 3.0,
        "epsilon_central_target": 3.0,
        "delta": 1e-6,
        "min_crowd_size": 10,
        "query_class": "test",
        "data_fields": ["cell"],
        "shuffler_instances": 2,
    }
)
BOOK = arithmetic.RecipeBook([RECIPE])
KEY = (arithmetic.HISTOGRAM, T0, T0 + DAY, "grid", "grid@1", None)


def _accumulator(buckets, respondents):
    accumulator = arithmetic.CrowdAccumulator.empty(8)
    accumulator.add_messages(np.asarray(buckets))
    for instance, count in respondents.items():
        accumulator.set_respondents(instance, count)
    return accumulator


def _pairs(pair):
    """A crowd record source that is one ``(instance, crowd record)`` pair."""
    yield pair


def test_combine_bucket_three_ways_agree():
    # Beam's combiners_test habit: call the CombineFn directly; sequential adds, merges of
    # single-element accumulators and merges after compact + pickling must agree.
    other = (*KEY[:5], "other")
    parts = [
        arithmetic.CrowdBucket({KEY: _accumulator([1, 2], {0: 4})}),
        arithmetic.CrowdBucket({KEY: _accumulator([2], {1: 4}), other: _accumulator([3], {0: 1})}),
        arithmetic.CrowdBucket({KEY: _accumulator([7, 7], {})}),
    ]
    combine = CombineBucket()

    def fresh():
        return [pickle.loads(pickle.dumps(p)) for p in parts]

    sequential = combine.create_accumulator()
    for part in fresh():
        sequential = combine.add_input(sequential, part)
    merged = combine.merge_accumulators(
        [combine.add_input(combine.create_accumulator(), p) for p in fresh()]
    )
    compacted = combine.merge_accumulators(
        [pickle.loads(pickle.dumps(combine.compact(p))) for p in fresh()] + [None]
    )
    for result in (sequential, merged, compacted):
        bucket = combine.extract_output(result)
        assert bucket.crowds[other].messages == 1
        output = bucket.crowds[KEY]
        np.testing.assert_array_equal(output.counts.dense(), [0, 1, 2, 0, 0, 0, 0, 2])
        assert output.respondents == {0: 4, 1: 4}
        assert output.messages == 5
    assert combine.extract_output(combine.create_accumulator()) is None


def test_sum_counts_and_metrics_balance():
    combine = SumCounts()
    total = combine.merge_accumulators(
        [
            {"read": 5, "messages": 4, "rejected:crc_mismatch": 1},
            {"read": 1, "rejected:empty": 1},
        ]
    )
    summary = metrics_summary(combine.extract_output(total))
    assert summary["adds_up"] and summary["dead_lettered"] == 2
    assert summary["rejected_by_reason"] == {"crc_mismatch": 1, "empty": 1}
    assert not metrics_summary({"read": 3, "messages": 1})["adds_up"]
    unknown = metrics_summary({"read": 1, "messages": 1, "unknown_records:unreadable_file": 1})
    assert not unknown["adds_up"] and unknown["chunks_of_unknown_records"] == {"unreadable_file": 1}


def _write_release_file(path, rows):
    records = [
        {
            "schema_version": 1,
            "window_start": T0,
            "window_end": T0 + DAY,
            "channel": "grid",
            "recipe_id": recipe_id,
            "crowd_id": None,
            "payload": payload,
            "payload_crc32c": crc32c(payload) if crc is None else crc,
        }
        for recipe_id, payload, crc in rows
    ]
    with open(path, "wb") as handle:
        fastavro.writer(handle, parsed_schema("shuffled_message"), records)


@pytest.fixture(scope="module")
def release_files(tmp_path_factory):
    """Two instances' message files of one crowd, 400 respondents, plus bad records."""
    root = tmp_path_factory.mktemp("releases")
    rng = seeded_generator(11)
    randomizer = RECIPE.build_randomizer()
    values = rng.integers(0, 8, size=400)
    messages = randomizer.randomize(values, rng)
    instance = rng.integers(0, 2, size=len(messages))
    census = encode_payloads(CENSUS, {}, count=1).to_list()[0]  # retired: never counted
    payloads = encode_payloads("bucket", {"bucket": messages.bucket}).to_list()
    files = []
    for u in (0, 1):
        rows = [("grid@1", p, None) for p, i in zip(payloads, instance, strict=True) if i == u]
        path = root / f"instance{u}.avro"
        _write_release_file(path, rows)
        files.append(str(path))
    bad = root / "bad.avro"
    _write_release_file(
        bad, [("grid@1", payloads[0], 7), ("nope@1", payloads[0], None), ("grid@1", census, None)]
    )
    files.append(str(bad))
    garbage = root / "garbage.avro"
    garbage.write_bytes(b"not an avro file")
    files.append(str(garbage))
    counts = np.bincount(values, minlength=8)
    # What the two instances' commit records state: 400 respondents each, a withheld next day.
    crowd = {"window_start_ms": T0, "window_end_ms": T0 + DAY, "channel": "grid",
             "recipe_id": "grid@1", "crowd_id": None, "status": "released",
             "respondents_released": 400, "messages_released": 0}  # fmt: skip
    withheld = {**crowd, "window_start_ms": T0 + DAY, "window_end_ms": T0 + 2 * DAY,
                "status": "withheld", "respondents_released": None}  # fmt: skip
    commits = [(0, crowd), (1, crowd), (0, withheld)]
    return files, commits, messages.bucket_sums(8), counts


def test_aggregate_releases_adds_every_file_and_dead_letters_bad_records(release_files):
    files, commits, sums, _ = release_files
    options = PipelineOptions(["--runner=FnApiRunner"])
    with beam.Pipeline(options=options) as pipeline:
        outputs = (
            pipeline | "Files" >> beam.Create(files),
            pipeline | "Commits" >> beam.Create(commits),
        ) | AggregateReleases(
            BOOK, SUPPORTED_SCHEMA_VERSIONS, batch_records=100, read_crowds=_pairs
        )
        crowds = outputs.buckets | beam.FlatMap(
            lambda kv: [
                (key, accumulator.counts.dense().tolist(), accumulator.respondents)
                for key, accumulator in kv[1].items()
            ]
        )
        assert_that(crowds, equal_to([(KEY, sums.tolist(), {0: 400, 1: 400})]), label="crowds")
        reasons = outputs.dead_letters | beam.FlatMap(
            lambda letters: [x["reason"] for x in letters]
        )
        assert_that(
            reasons,
            equal_to(["crc_mismatch", "unknown_recipe", "census_not_counted", "unreadable_file"]),
            label="dead letters",
        )
        balance = (
            outputs.counts
            | beam.Map(metrics_summary)
            | beam.Map(lambda m: (m["files"], m["dead_lettered"], m["adds_up"]))
        )
        # The garbage file holds an unknown number of records: the balance cannot hold.
        assert_that(balance, equal_to([(4, 3, False)]), label="counts")


@pytest.mark.parametrize(("spill", "sizes"), [(False, False), (True, False), (False, True)])
def test_estimate_and_write_analysis(release_files, tmp_path, spill, sizes):
    """The same analysis whether the estimates' batches cross the groupings as bytes or are
    spilled to files whose paths cross instead, and whether the crowd sizes' privacy is
    evaluated before the estimates (``sizes``) or by them."""
    files, commits, _, true_counts = release_files
    spill_dir = str(tmp_path / "spilled") if spill else None
    truth_path = tmp_path / "truth.parquet"
    truth = {"window_start": [T0] * 8, "bucket": list(range(8)), "count": true_counts.tolist()}
    pq.write_table(pa.table(truth), truth_path)
    config = AnalysisConfig(
        BOOK, postprocessing="clip_nonnegative", truth=(TruthSource(str(truth_path), "grid@1"),)
    )
    output = tmp_path / "out"
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        aggregated = (
            pipeline | "Files" >> beam.Create(files),
            pipeline | "Commits" >> beam.Create(commits),
        ) | AggregateReleases(BOOK, {1}, read_crowds=_pairs)
        estimates = aggregated.buckets | EstimateBuckets(
            config, spill_dir=spill_dir, sizes=aggregated.crowd_sizes if sizes else None
        )
        _ = (estimates, aggregated.counts) | WriteAnalysis(str(output), config, {"test": True})
    if spill:  # a bucket's batches in one file, named by its key: the crowd's bucket (its
        # histogram rows and report) and the withheld crowd's, a day later (its note)
        spilled = {p.name for p in (tmp_path / "spilled").iterdir() if p.name != TEMPORARY_DIR}
        bucket = arithmetic.bucket_key(KEY)[3]
        assert spilled == {
            f"{arithmetic.HISTOGRAM}-{start}-{start + DAY}-b{bucket:05d}-00000"
            for start in (T0, T0 + DAY)
        }
    table = pq.read_table(output / "histograms.parquet")
    assert table.schema == histogram_schema(config)
    assert table.column("bucket").to_pylist() == list(range(8))
    assert table.column("truth").to_pylist() == true_counts.tolist()
    assert set(table.column("n").to_pylist()) == {400.0}
    estimate = table.column("estimate").to_numpy()
    stderr = table.column("stderr").to_numpy()
    # 8 buckets at 4.5 sigma: ~5e-5 false failures in all.
    assert np.all(np.abs(estimate - true_counts) <= 4.5 * stderr)
    clipped = table.column("estimate_clip_nonnegative").to_numpy()
    np.testing.assert_array_equal(clipped, np.maximum(estimate, 0))
    assert pq.read_table(output / "longitudinal.parquet").num_rows == 0
    summary = json.loads((output / "summary.json").read_text())
    reports = read_reports(str(output))
    assert summary["reports"]["histograms"] == 1 and summary["withheld"]["crowds"] == 1
    [crowd] = reports["histograms"]
    assert crowd["respondents_by_instance"] == {"0": 400, "1": 400}
    assert crowd["privacy"]["respondents"] == 400
    assert crowd["accuracy"]["truth_scale"] == 1.0
    assert not summary["metrics"]["adds_up"] and summary["metrics"]["dead_lettered"] == 3
    assert summary["metrics"]["chunks_of_unknown_records"] == {"unreadable_file": 1}
    [withheld] = reports["withheld"]
    assert withheld["window_start"] == T0 + DAY and not withheld["estimated"]
    assert read_withheld(str(output)) == reports["withheld"]  # the notes without the reports
    assert summary["inputs"] == {"test": True}


def test_spilled_batches_are_read_back_and_a_short_file_is_an_error_naming_it(tmp_path):
    batches = [b"first", b"", bytes(range(256)) * 40, b"last"]
    spilled = spill_batches(str(tmp_path), "bucket-00000", batches)
    assert [load_batch(where) for where in spilled] == batches
    assert {where.path for where in spilled} == {str(tmp_path / "bucket-00000")}
    assert load_batch(b"inline") == b"inline"
    path = tmp_path / "bucket-00000"
    path.write_bytes(path.read_bytes()[:-2])  # truncated after it was written
    assert load_batch(spilled[1]) == b""
    with pytest.raises(OSError, match="bucket-00000: a spilled batch of 4 bytes at 10245 holds 2"):
        load_batch(spilled[3])


def test_table_batches_are_written_in_parts_without_a_whole_table_gather(tmp_path):
    schema = pa.schema([("crowd", pa.string()), ("bucket", pa.int64())])
    batches = [
        (d % 5, pack_table(pa.table({"crowd": [f"day{d:02d}"] * 3, "bucket": [2, 0, 1]},
                                    schema=schema)))
        for d in range(12)
    ]  # fmt: skip
    directory = tmp_path / "histograms.parquet"
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        _ = pipeline | beam.Create(batches) | WriteTableBatches(str(directory), schema, shards=5)
    parts = sorted(p.name for p in directory.iterdir() if p.name != TEMPORARY_DIR)
    assert parts == [f"part-{s:05d}-of-00005.parquet" for s in range(5)]  # empty parts too
    assert not list((directory / TEMPORARY_DIR).iterdir())  # every part was renamed into place
    table = pq.read_table(directory)
    assert table.num_rows == 36 and table.schema == schema
    for d in range(12):  # each batch sits whole, sorted, in its part
        part = pq.read_table(directory / parts[d % 5])
        rows = part.filter(pc.equal(part.column("crowd"), f"day{d:02d}"))
        assert rows.column("bucket").to_pylist() == [0, 1, 2]
    assert table_parts(0) == 1 and table_parts(2_500_000) == 3


def test_batched_parts_hold_exactly_the_sorted_records(tmp_path):
    """Lines and tables cross the grouping into parts in compressed batches; the parts written
    from batches of any batching equal the records sorted, as one by one."""
    reports = [
        {"kind": arithmetic.HISTOGRAM, "channel": "c", "recipe_id": "r@1", "crowd_id": f"k{i % 7}",
         "window_start": T0 + (i // 7) * DAY, "estimate": [0.5 * i, np.float64(i)]}
        for i in range(40)
    ]  # fmt: skip
    shuffled = [reports[i] for i in seeded_generator(5).permutation(len(reports))]
    batches = [
        pack_lines([json_line(report) for report in shuffled[start : start + 6]])
        for start in range(0, 40, 6)
    ]
    assert len(batches) > 3
    write_json_part(str(tmp_path / "r"), 0, 1, batches, report_order)
    expected = [json.loads(json_line(r)) for r in sorted(reports, key=report_order)]
    assert read_json_parts(str(tmp_path / "r")) == expected

    schema = pa.schema([("crowd", pa.string()), ("bucket", pa.int64())])
    crowds = [pa.table({"crowd": [f"d{d:02d}"] * 3, "bucket": [2, 0, 1]}, schema=schema)
              for d in seeded_generator(6).permutation(30)]  # fmt: skip
    batched = [concat_compact(crowds[start : start + 7]) for start in range(0, 30, 7)]
    path = write_part(str(tmp_path / "h"), 0, 1, batched, schema)
    one_by_one = write_part(str(tmp_path / "h1"), 0, 1, crowds, schema)
    assert pq.read_table(path).equals(pq.read_table(one_by_one))
    packed = [pack_table(table) for table in batched]  # compressed IPC bytes, as buckets send
    assert all(isinstance(blob, bytes) for blob in packed)
    from_bytes = write_part(str(tmp_path / "hb"), 0, 1, packed, schema)
    assert pq.read_table(from_bytes).equals(pq.read_table(one_by_one))
    assert pq.read_table(path).num_rows == 90


def test_json_lines_written_directly_equal_those_of_json_ready():
    records = [
        {"a": np.int64(3), "b": [np.float64(0.1), 2.5], "c": np.arange(3), "d": {1: "x"}},
        {"a": np.float32(0.25), "nested": {"e": (1, np.int32(2))}, "none": None},
        {"nan": float("nan"), "arr": np.array([1.0, np.inf])},  # non-finite: through json_ready
        {3: "int key at the top", "k": np.float64(-0.0)},
    ]
    for record in records:
        assert json_line(record) == json.dumps(json_ready(record), allow_nan=False)
    assert json.loads(json_line(records[2])) == {"nan": None, "arr": [1.0, None]}


def test_crowd_sizes_are_evaluated_once_for_the_estimates(monkeypatch):
    """EvaluateCrowdSizes gives, per size, the evaluations the reports of that size need (of
    each of its recipes), so that a worker given them evaluates nothing; a recipe it does not
    know, or a size the accounting refuses, gives nothing."""
    import pickle

    import privacy.accounting.solvers as solvers
    from transforms.analyzer.analyze import EvaluateCrowdSizes

    monkeypatch.setattr(solvers, "_AMPLIFIED", {})
    monkeypatch.setattr(solvers, "_GIVEN", {})
    recipe = BOOK.get("grid@1")
    evaluate = EvaluateCrowdSizes(AnalysisConfig(BOOK, deletion={0: (0.5, 1e-9)}))
    [blob] = evaluate.process((250, ["grid@1", "nope@1", "grid@1"]))
    assert not list(evaluate.process((250, ["nope@1"])))
    assert not list(evaluate.process((10**11, ["grid@1"])))  # more than the bounds accept
    fresh = {
        "both": arithmetic.privacy_summary(recipe, {0: 250, 1: 250}, {0: (0.5, 1e-9)}),
        "one": arithmetic.privacy_summary(recipe, {1: 250}, None),
    }
    monkeypatch.setattr(solvers, "_AMPLIFIED", {})
    solvers.remember_amplifications(pickle.loads(blob))

    def refuse(*args, **kwargs):
        raise AssertionError("evaluated again")

    monkeypatch.setattr(solvers, "tight_bound", refuse)
    monkeypatch.setattr(solvers, "central_epsilon", refuse)
    assert arithmetic.privacy_summary(recipe, {0: 250, 1: 250}, {0: (0.5, 1e-9)}) == fresh["both"]
    assert arithmetic.privacy_summary(recipe, {1: 250}, None) == fresh["one"]
    with pytest.raises(AssertionError, match="evaluated again"):
        arithmetic.privacy_summary(recipe, {0: 251, 1: 252}, None)


def test_cached_privacy_reports_equal_fresh_ones_and_are_copies():
    recipe = BOOK.get("grid@1")
    for respondents, deletion in [({0: 400, 1: 400}, None), ({1: 30, 0: 25}, {0: (0.5, 1e-9)})]:
        fresh = arithmetic.privacy_summary(recipe, respondents, deletion)
        first = arithmetic.cached_privacy_summary(recipe, respondents, deletion)
        assert first == fresh
        first["notes"].append("changed by a caller")
        assert arithmetic.cached_privacy_summary(recipe, respondents, deletion) == fresh


def test_part_rows_sorted_by_ranks_equal_arrows_sort():
    """sorted_rows (one lexsort of the string columns' ranks) orders rows as Arrow's stable
    sort_by does: null crowd IDs last, non-ASCII names by their bytes, ties in their order,
    chunked columns; a column it cannot rank (floats) goes to sort_by itself."""
    rng = seeded_generator(31)
    rows = 400
    names = ["c", "b", "é", "ü", "Z", "a b"]
    crowd = [None if rng.random() < 0.1 else names[rng.integers(0, 6)] + str(rng.integers(0, 3))
             for _ in range(rows)]  # fmt: skip
    table = pa.table(
        {
            "channel": pa.array([names[i] for i in rng.integers(0, 2, rows)]),
            "crowd": pa.array(crowd, pa.string()),
            "window_start": pa.array(rng.integers(0, 3, rows) * DAY, pa.timestamp("ms", tz="UTC")),
            "period": pa.array(rng.integers(1, 4, rows), pa.int32()),
            "estimate": pa.array(rng.random(rows)),  # the tie-break: each row's own
        }
    )
    chunked = pa.concat_tables([table.slice(0, 150), table.slice(150)])
    for keys in (["channel", "crowd", "window_start", "period"], ["crowd"], ["period", "channel"]):
        for source in (table, chunked):
            expected = source.sort_by([(n, "ascending") for n in keys])
            assert sorted_rows(source, keys).equals(expected), keys
    assert sorted_rows(table, ["estimate"]).equals(table.sort_by([("estimate", "ascending")]))
