"""Crowds estimated together as rows against the same crowds estimated one by one.

``EstimateBucket`` de-biases the histogram crowds of one recipe as the rows of one matrix, makes
one table of them and joins their report lines from cached texts; ``crowd_at_a_time=True`` is
the one-crowd path (``CrowdEstimator.estimate``, ``histogram_table``, ``json_line`` of
``histogram_report``). Both run on copies of one bucket holding the shipped small recipes (rows
and one-crowd ones: count-mean sketch, longitudinal), a recipe with unequal instance weights,
crowds one instance withheld, crowds without respondents, sparse counts, rejected and
all-rejected crowds, withheld records and a simulation's truth, under every post-processing.
Everything must be equal exactly: the same floats to the last bit (the rows run the very
element-wise operations of the one-crowd estimators), the same lines and notes, the same table
rows (compared sorted as every part file is written: rows within a batch come by recipe group).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privacy.estimators import debias_one_hot, norm_sub, norm_sub_rows, one_hot_rows
from privacy.rng import seeded_generator
from schemas.recipes import load_recipe
from tests.transforms.analyzer.analyzer_messages import DAY, T0, recipe_of
from transforms.analyzer import arithmetic
from transforms.analyzer.analyze import (
    HISTOGRAM_TAG,
    LONGITUDINAL_TAG,
    NOTE_TAG,
    PICTURE_TAG,
    REPORT_TAG,
    AnalysisConfig,
    CrowdEstimator,
    EstimateBucket,
    TruthSource,
)
from transforms.analyzer.report_files import (
    note_order,
    report_order,
    unpack_ordered_lines,
    write_json_part,
)
from transforms.analyzer.tables import unpack_table

SMALL = [
    "small_asymmetric_one_hot",
    "small_binary_rr",
    "small_count_mean_sketch",
    "small_one_hot_rappor",
    "small_report_fragmented",
    "small_symmetric_one_hot",
    "small_zero_sum_histogram",
]
WEIGHTED = recipe_of(
    "weighted",
    "one_hot_rappor",
    {"domain_size": 5, "epsilon": 2.0},
    instance_weights=[0.3, 0.7],
)
RECIPES = [load_recipe(name) for name in SMALL] + [WEIGHTED]
TREE = load_recipe("small_longitudinal")
BOOK = arithmetic.RecipeBook([*RECIPES, TREE])
TRUTH_RECIPE = load_recipe("small_one_hot_rappor")


def _histogram(recipe, rng, respondents, rejected=None, messages=True, dense_limit=1 << 20):
    domain = recipe.build_randomizer().message_domain_size
    accumulator = arithmetic.CrowdAccumulator.empty(domain, dense_limit)
    if messages:
        buckets = rng.integers(0, domain, size=int(rng.integers(5, 60)))
        accumulator.add_messages(buckets.astype(np.int64))
    for instance, count in respondents.items():
        accumulator.set_respondents(instance, count)
    for reason, count in (rejected or {}).items():
        accumulator.add_rejected(reason, count)
    return accumulator


def _bucket():
    """One bucket of every kind of crowd (keys in two windows: a bucket's DoFn does not care);
    per recipe 12 crowds the rows take, 3 they leave to the one-crowd path and 1 all rejected."""
    rng = seeded_generator(23)
    crowds = {}
    withheld = []
    for recipe in RECIPES:
        channel, recipe_id = recipe.channel, recipe.id

        def key(crowd_id, window=0, channel=channel, recipe_id=recipe_id):
            start = T0 + window * DAY
            return (arithmetic.HISTOGRAM, start, start + DAY, channel, recipe_id, crowd_id)

        both = {0: 40, 1: 40} if recipe is not WEIGHTED else {1: 37, 0: 41}
        if len(recipe.instance_weights) == 1:  # the zero-sum recipe: one shuffler
            both = {0: 40}
        for index in range(6):  # several crowds sharing their respondents
            crowds[key(f"c{index}")] = _histogram(recipe, rng, both)
        crowds[key("reversed")] = _histogram(recipe, rng, dict(reversed(list(both.items()))))
        crowds[key("one_instance")] = _histogram(recipe, rng, {0: 40})
        withheld.append((T0, T0 + DAY, channel, recipe_id, "one_instance", 1))
        crowds[key("nobody")] = _histogram(recipe, rng, {})  # n_eff 0: "no estimate"
        crowds[key("stranger")] = _histogram(recipe, rng, {**both, 5: 3})  # no instance 5
        crowds[key("rejected")] = _histogram(recipe, rng, both, {"crc_mismatch": 3})
        crowds[key("all_rejected")] = _histogram(recipe, rng, both, {"bad": 2}, messages=False)
        crowds[key("sparse")] = _histogram(recipe, rng, both, dense_limit=0)
        crowds[key(None)] = _histogram(recipe, rng, both)
        crowds[key(None, window=1)] = _histogram(recipe, rng, both)
        crowds[key("later", window=1)] = _histogram(recipe, rng, both)
        withheld.append((T0, T0 + DAY, channel, recipe_id, "gone", 0))
    window_ms = DAY
    nodes = 2 * TREE.build_randomizer().periods - 1
    for crowd_id in ("t0", None):
        tree = arithmetic.LongitudinalAccumulator(nodes, window_ms)
        tree.add_messages(0, rng.integers(0, nodes, size=40), rng.choice([-1, 1], size=40))
        for period in range(4):
            tree.set_respondents(period * window_ms, 0, 30)
            tree.set_respondents(period * window_ms, 1, 30)
        key = (arithmetic.LONGITUDINAL, 0, window_ms, TREE.channel, TREE.id, crowd_id)
        crowds[key] = tree
    return arithmetic.CrowdBucket(crowds, withheld)


def _truth(tmp_path):
    path = tmp_path / "truth.parquet"
    domain = TRUTH_RECIPE.build_randomizer().domain_size
    rng = seeded_generator(3)
    buckets = rng.integers(0, domain, size=30)
    table = {"window_start": [T0] * 30, "bucket": buckets, "count": rng.integers(1, 4, size=30)}
    pq.write_table(pa.table(table), path)
    return (TruthSource(str(path), TRUTH_RECIPE.id),)


def _outputs(fn, bucket):
    """Every output of one ``process`` call, by tag (tables concatenated)."""
    unit = (arithmetic.HISTOGRAM, T0, T0 + DAY, 0)
    out = {"totals": [], "pictures": [], "lines": [], "notes": [], "tables": {}}
    for item in fn.process((unit, pickle.loads(pickle.dumps(bucket)))):
        if isinstance(item, dict):
            out["totals"].append(item)
            continue
        tag, value = item.tag, item.value
        if tag == PICTURE_TAG:
            out["pictures"].append(value)
        elif tag in (REPORT_TAG, NOTE_TAG):
            orders, lines = unpack_ordered_lines(value[1])
            order = report_order if tag == REPORT_TAG else note_order
            # The sort keys a batch carries are those its part would read from its lines.
            assert orders == [order(json.loads(line)) for line in lines]
            out["lines" if tag == REPORT_TAG else "notes"] += lines
            out.setdefault(tag, []).append(value[1])
        else:
            out["tables"].setdefault(tag, []).append(unpack_table(value[1]))
    for tag, tables in out["tables"].items():
        table = pa.concat_tables(tables)
        order = [c for c in ("channel", "recipe_id", "crowd", "window_start", "round_start",
                             "bucket", "period") if c in table.column_names]  # fmt: skip
        out["tables"][tag] = table.sort_by([(c, "ascending") for c in order])
    return out


@pytest.mark.parametrize("postprocessing", ["none", "clip_nonnegative", "norm_sub"])
@pytest.mark.parametrize("rows_per_batch", [1 << 16, 300])
def test_rows_equal_the_one_crowd_estimates(tmp_path, postprocessing, rows_per_batch):
    bucket = _bucket()
    config = AnalysisConfig(
        BOOK,
        postprocessing=postprocessing,
        deletion={0: (0.5, 1e-9)},
        truth=_truth(tmp_path),
        pictured=frozenset(
            [
                (arithmetic.HISTOGRAM, T0, T0 + DAY, r.channel, r.id, "c0")
                for r in (TRUTH_RECIPE, WEIGHTED)
            ]
            + [(arithmetic.HISTOGRAM, T0, T0 + DAY, TRUTH_RECIPE.channel, TRUTH_RECIPE.id, None)]
        ),
    )
    results = []
    for crowd_at_a_time in (True, False):
        fn = EstimateBucket(config, rows_per_batch=rows_per_batch, crowd_at_a_time=crowd_at_a_time)
        fn.setup()
        results.append(_outputs(fn, bucket))
    one, rows = results

    # The rows path took every crowd it can: all but sketches, longitudinal, sparse, nobody.
    estimator = CrowdEstimator(config)
    crowds = [(k, a) for k, a in bucket.items() if arithmetic.all_rejected_note(k, a) is None]
    groups, single = estimator.row_groups(crowds)
    assert len(groups) == len(RECIPES) - 1
    assert all(
        crowds[p][0][4] in {"small_count_mean_sketch@1", TREE.id}
        or crowds[p][0][5] in {"sparse", "nobody", "stranger"}
        for p in single
    )
    assert sum(len(group.positions) for group in groups) == 12 * (len(RECIPES) - 1)

    assert rows["lines"] == one["lines"] and len(one["lines"]) > 100
    written = [  # the parts as written: sorted by the keys the batches carry
        Path(write_json_part(str(tmp_path / name), 0, 1, result[REPORT_TAG], report_order))
        for name, result in (("one", one), ("rows", rows))
    ]
    assert written[0].read_bytes() == written[1].read_bytes()
    assert [json.loads(line) for line in written[0].read_text().splitlines()] == sorted(
        (json.loads(line) for line in one["lines"]), key=report_order
    )
    assert rows["notes"] == one["notes"]
    assert rows["totals"] == one["totals"]
    assert rows["tables"].keys() == one["tables"].keys() == {HISTOGRAM_TAG, LONGITUDINAL_TAG}
    for tag, table in one["tables"].items():
        assert rows["tables"][tag].equals(table), tag
    truth = one["tables"][HISTOGRAM_TAG].column("truth")
    assert 0 < truth.null_count < len(truth)  # a truth for some crowds, nulls for the others
    assert len(rows["pictures"]) == len(one["pictures"]) == 3
    pictures = {tuple(r[k] for k in ("recipe_id", "crowd_id", "window_start")): (r, t)
                for r, t in rows["pictures"]}  # fmt: skip
    for report, table in one["pictures"]:
        mine, own = pictures[tuple(report[k] for k in ("recipe_id", "crowd_id", "window_start"))]
        assert mine == report and own.equals(table)
        if report["crowd_id"] is None:
            assert "accuracy" in report


def _bucket_with_objects_in_groups():
    """:func:`_bucket` and crowds of its recipes whose sums were sparse (objects in the
    bucket's content), made dense by ``densify`` as ``CombineBucket.extract_output`` does: they
    join their recipe's group beside the crowds held as rows."""
    bucket = _bucket()
    crowds = dict(bucket.crowds)
    rng = seeded_generator(29)
    for recipe in RECIPES:
        for index in range(3):
            key = (arithmetic.HISTOGRAM, T0, T0 + DAY, recipe.channel, recipe.id, f"s{index}")
            crowds[key] = _histogram(recipe, rng, {0: 40}, dense_limit=0)
    out = pickle.loads(pickle.dumps(arithmetic.CrowdBucket(crowds, bucket.withheld)))
    out.densify(1 << 20)
    return out


@pytest.mark.parametrize("make", [_bucket, _bucket_with_objects_in_groups])
def test_bucket_columns_split_as_the_items_do(make):
    """bucket_crowds (the bucket's rows read as columns) makes the groups, positions and notes
    that row_groups makes of the bucket's accumulators in their order, also of groups holding
    rows and objects; a crowd in two parts of a bucket's content leaves it to the items
    (None)."""
    bucket = pickle.loads(pickle.dumps(make()))
    estimator = CrowdEstimator(AnalysisConfig(BOOK))
    split = estimator.bucket_crowds(bucket.content())
    assert split is not None and bucket.content().others  # rows of several domains and objects
    items = list(pickle.loads(pickle.dumps(make())).items())
    crowds = [(k, a) for k, a in items if arithmetic.all_rejected_note(k, a) is None]
    notes = [n for k, a in items if (n := arithmetic.all_rejected_note(k, a)) is not None]
    groups, single = estimator.row_groups(crowds)
    assert split.keys == [key for key, _ in crowds]
    assert split.single == single and split.rejected_notes == notes and len(notes) == len(RECIPES)
    assert len(split.groups) == len(groups)
    for mine, theirs in zip(split.groups, groups, strict=True):
        assert mine.recipe is theirs.recipe and mine.positions == theirs.positions
        assert mine.keys == theirs.keys and mine.respondents == theirs.respondents
        assert mine.by_instance == theirs.by_instance and mine.messages == theirs.messages
        assert mine.rejected == theirs.rejected
        assert np.array_equal(mine.sums, np.stack(theirs.sums))
    for position in single:
        one, other = split.accumulator(position), crowds[position][1]
        assert type(one) is type(other) and one.messages == other.messages
        assert one.respondents == other.respondents
        if isinstance(one, arithmetic.CrowdAccumulator):
            assert one.counts.is_dense == other.counts.is_dense and one.rejected == other.rejected
            if one.counts.is_dense:
                assert np.array_equal(one.counts.dense(), other.counts.dense())

    twice = arithmetic.CrowdBucket(dict(crowds[:3])).content()
    domain, rows = next(iter(twice.rows.items()))
    twice.others[rows.keys[0]] = rows.accumulator(0).copy()  # one crowd as a row and an object
    assert estimator.bucket_crowds(twice) is None


def test_row_estimators_equal_the_one_crowd_ones_row_by_row():
    rng = seeded_generator(5)
    sums = rng.integers(0, 50, size=(7, 9)).astype(np.float64)
    n = rng.integers(1, 80, size=7).astype(np.float64)
    n[2] = 0.0  # norm_sub of a zero total is all zeros
    estimate, stderr = one_hot_rows(sums, n[:, np.newaxis], 0.75, 0.25)
    projected = norm_sub_rows(estimate, n)
    for row in range(7):
        alone = debias_one_hot(sums[row], n[row], 0.75, 0.25)
        np.testing.assert_array_equal(estimate[row], alone.estimate)
        np.testing.assert_array_equal(stderr[row], alone.stderr)
        np.testing.assert_array_equal(projected[row], norm_sub(alone).estimate)
    assert not projected[2].any()
    with pytest.raises(ValueError, match="one total per row"):
        norm_sub_rows(estimate, n[:3])
