"""A crowd table's per-crowd figures must agree with the messages its bucket's files hold (issue
#11).

One esa-release/2 release of two crowds in one bucket (30 respondents x 2 messages, 20 x 2) is
built (tests/release_fixtures.py); each case edits only the crowd table and re-commits it with
consistent totals (every file keeps its committed size and SHA-256, the release's totals and the
bucket's message count still match, so ``verify_release`` passes) and expects ``esa analyze`` to
refuse it in one line naming the release and the crowd, exit 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.commandline import main as cli
from pipelines.release_counts import count_crowd_messages, release_stems
from schemas.release import commit as rel
from schemas.release.crowd_tables import read_crowd_table
from tests import release_fixtures as fx
from tests.transforms import report_factory as rf

Edit = Callable[["_Table"], None]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("crowds")
    recipe, fields = rf.write_recipe(root, "crowds_test", min_crowd_size=5)
    crowds = [fx.crowd("a", 30, start=rf.T0, **fields), fx.crowd("b", 20, start=rf.T0, **fields)]
    messages = [[b"a/%d" % i for i in range(60)], [b"b/%d" % i for i in range(40)]]
    parameters = {"crowd_threshold": 10}
    fx.write_release(root / "rel", crowds, messages, parameters=parameters, buckets=1, groups=3)
    return root / "rel", recipe


class _Table(dict):
    """A crowd table's rows by crowd ID; ``rows`` keeps the table (a list) for removals."""

    def __init__(self, rows: list[dict]) -> None:
        super().__init__((row["crowd_id"], row) for row in rows)
        self.rows = rows


def _move(table: _Table) -> None:
    # 10 of a's messages claimed by b, and b's n inflated 20 -> 200: the total still holds
    a, b = table["a"], table["b"]
    a["messages_released"] -= 10
    b.update(messages_released=b["messages_released"] + 10, respondents_released=200)


def _swap_counts(table: _Table) -> None:
    a, b = table["a"], table["b"]
    a["messages_released"], b["messages_released"] = b["messages_released"], a["messages_released"]


def _relabel(table: _Table) -> None:
    table["b"]["recipe_id"] = "image_grid_onehot@1"


def _rechannel(table: _Table) -> None:
    table["b"]["channel"] = "other_channel"


def _remove(table: _Table) -> None:
    b = table["b"]
    table.rows.remove(b)
    table["a"]["messages_released"] += b["messages_released"]


def _rename(table: _Table) -> None:
    table["b"]["crowd_id"] = "c"


CASES: list[tuple[str, Edit, str]] = [
    ("messages moved and n inflated", _move, "states messages_released 50, its files hold 60"),
    ("message counts swapped", _swap_counts, "states messages_released 40, its files hold 60"),
    ("recipe_id relabelled", _relabel, "lists as not released"),
    ("channel relabelled", _rechannel, "lists as not released"),
    ("crowd removed", _remove, "lists as not released"),
    ("crowd renamed", _rename, "lists as not released"),
]


def _analyze(release_dir: Path, recipe: str, output: Path) -> int:
    argv = ["analyze", "--input", str(release_dir), "--output", str(output), "--recipe", recipe]
    return cli.main(argv)


def _edited_copy(made: tuple[Path, str], tmp_path: Path, edit: Edit) -> tuple[Path, str]:
    """A copy of the release with its crowd table edited and the release re-committed."""
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    [table] = (copy / "crowds").iterdir()
    crowds = _Table(read_crowd_table(str(table)))
    edit(crowds)
    fx.write_avro(table, "released_crowd", fx.table_rows(crowds.rows))
    fx.recommit(copy, totals=True)
    return copy, recipe


@pytest.mark.parametrize(("edit", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_commit_figures_that_disagree_with_the_files_are_refused(
    made: tuple[Path, str], tmp_path: Path, capsys, edit: Edit, words: str
) -> None:
    copy, recipe = _edited_copy(made, tmp_path, edit)
    # The release-wide checks pass: files re-committed, totals and messages per bucket unchanged.
    rel.verify_release(str(copy))
    assert _analyze(copy, recipe, tmp_path / "an") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("esa analyze: error: refusing release"), err
    assert str(copy) in err[0] and words in err[0] and '"crowd_id": "' in err[0], err
    assert not (tmp_path / "an" / "summary.json").exists()


def test_a_refused_release_never_has_results_written(
    made: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count check gates every output step, not only summary.json: with the driver's
    clean-up of a failed run switched off, the refused release has left no table, report,
    dead letter or picture behind (they were never written, not written and removed)."""
    from pipelines import analyze

    copy, recipe = _edited_copy(made, tmp_path, _move)
    monkeypatch.setattr(analyze, "remove_results", lambda output: None)
    assert _analyze(copy, recipe, tmp_path / "an") == 2
    left = sorted(
        path.relative_to(tmp_path / "an").as_posix()
        for path in (tmp_path / "an").rglob("*")
        if path.is_file()
    )
    assert not [name for name in left if name.split("/")[0] in analyze.RESULT_NAMES], left


def test_crowd_sizes_are_evaluated_for_agreeing_releases_only(
    made: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crowd sizes' privacy evaluations (EvaluateCrowdSizes) wait for the count check too:
    a refused release costs none, an accepted one evaluates its sizes (written to a file, so a
    worker process's calls count as well)."""
    from transforms.analyzer.analyze import EvaluateCrowdSizes

    calls = tmp_path / "evaluated.txt"
    process = EvaluateCrowdSizes.process

    def recorded(self, size):
        with open(calls, "a") as handle:
            handle.write(f"{size[0]}\n")
        return process(self, size)

    monkeypatch.setattr(EvaluateCrowdSizes, "process", recorded)
    copy, recipe = _edited_copy(made, tmp_path, _move)
    assert _analyze(copy, recipe, tmp_path / "refused") == 2
    assert not calls.exists()
    release_dir, recipe = made
    assert _analyze(release_dir, recipe, tmp_path / "accepted") == 0
    assert calls.read_text().split()  # the sizes of its released crowds


def test_files_are_counted_per_crowd_key(made: tuple[Path, str]) -> None:
    release_dir, _ = made
    [(table, files)] = release_stems(rel.verify_release(str(release_dir)))
    assert len(files) == 3 and all("/messages/" in path for path in files)
    counts = count_crowd_messages(files, batch_records=7)
    assert sorted((key[4], n) for key, n in counts.items()) == [("a", 60), ("b", 40)]
    crowds = read_crowd_table(table)
    assert {c["crowd_id"]: c["messages_released"] for c in crowds} == {"a": 60, "b": 40}


def test_the_untouched_release_is_accepted(made: tuple[Path, str], tmp_path: Path) -> None:
    release_dir, recipe = made
    assert _analyze(release_dir, recipe, tmp_path / "an") == 0
    summary = json.loads((tmp_path / "an" / "summary.json").read_text())
    assert summary["metrics"]["read"] == 100 and summary["metrics"]["adds_up"]


def test_the_driver_reads_each_crowd_table_and_message_file_at_most_once(
    made: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pass over a release on the driver: verification, the per-crowd counts and the
    selection (pictured crowds, table sizes) all come from a single read of each crowd table
    and of each message file's crowd keys."""
    from pipelines import analyze as analyze_pipeline
    from pipelines import release_counts

    release_dir, recipe = made
    tables: list[str] = []
    counted: list[str] = []
    parse = rel.parse_crowd_table
    count = release_counts.count_crowd_messages

    def parse_spy(data: bytes, source: str):
        tables.append(source)
        return parse(data, source)

    def count_spy(files, batch_records=7):
        counted.extend(files)
        return count(files, batch_records)

    monkeypatch.setattr(rel, "parse_crowd_table", parse_spy)
    monkeypatch.setattr(analyze_pipeline, "check_crowd_counts", release_counts.check_crowd_counts)
    monkeypatch.setattr(release_counts, "count_crowd_messages", count_spy)
    book = analyze_pipeline.recipe_book([recipe])
    selection = analyze_pipeline.ReleaseSelection(book)
    [opened] = analyze_pipeline.discover_releases([str(release_dir)], None, selection)
    crowd_tables = [path for path in opened.entries if path.path.startswith("crowds/")]
    assert len(tables) == len(crowd_tables) == 1
    assert sorted(counted) == sorted(opened.files) and len(counted) == 3
    pictured, rows, crowds = selection.result()
    assert crowds == 2 and {key[5] for key in pictured} == {"a", "b"} and rows > 0
    # esa analyze's driver decodes no message file: its workers count as they decode.
    counted.clear()
    selection = analyze_pipeline.ReleaseSelection(book)
    analyze_pipeline.discover_releases([str(release_dir)], None, selection, count_messages=False)
    assert counted == [] and selection.result()[2] == 2


@pytest.mark.parametrize("as_columns", [False, True])
def test_the_analyzer_sizes_its_buckets_by_the_largest_unit_not_by_all_crowds(
    as_columns: bool,
) -> None:
    """ReleaseSelection.unit_crowds: the most crowds one instance holds in one kind and window
    (longitudinal crowds: every window of one length together, as their rounds span windows),
    so crowds spread over many windows get no more buckets than one window's need; the same
    for tables given as crowd dicts and as the verifying pass's columns (counted by Arrow)."""
    import pyarrow as pa

    from pipelines.analyze import ReleaseSelection
    from schemas.recipes import load_recipe
    from schemas.release.crowd_tables import CrowdColumns
    from transforms.analyzer import arithmetic

    one_hot, tree = load_recipe("small_one_hot_rappor"), load_recipe("small_longitudinal")
    selection = ReleaseSelection(arithmetic.RecipeBook([one_hot, tree]), pictures_wanted=False)
    day = 86_400_000

    def table(recipe, window: int, crowds: int, status: str = "released") -> object:
        start = rf.T0 + window * day
        rows = [{"window_start_ms": start, "window_end_ms": start + day, "instance": 0,
                 "channel": recipe.channel, "recipe_id": recipe.id, "crowd_id": f"c{i}",
                 "status": status, "respondents_released": 9, "messages_released": 9}
                for i in range(crowds)]  # fmt: skip
        return CrowdColumns(pa.Table.from_pylist(rows)) if as_columns else rows

    for window in range(30):  # 30 windows of 1,500 histogram crowds: one window's worth
        selection.add(0, table(one_hot, window, 1_000))
        selection.add(0, table(one_hot, window, 500, "withheld"))
    selection.add(1, table(one_hot, 0, 1_200))
    assert selection.result()[2] == 45_000 and selection.unit_crowds() == 1_500
    assert arithmetic.analyzer_buckets(selection.unit_crowds()) == arithmetic.ANALYZER_BUCKETS
    for window in range(30):  # a longitudinal crowd's windows are one unit
        selection.add(0, table(tree, window, 100))
    assert selection.unit_crowds() == 3_000


@pytest.mark.parametrize("batch_rows", [1, 700, 1 << 16])
def test_the_pictured_crowds_of_columns_are_those_of_crowd_dicts(
    batch_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ReleaseSelection: tables given as the verifying pass's columns (their picture
    candidates found by Arrow a batch of tables at a time) get the pictures tables of crowd
    dicts (each crowd looked at) get, whatever the batch's size."""
    import pyarrow as pa

    from pipelines import analyze as analyze_pipeline
    from schemas.recipes import load_recipe
    from schemas.release.crowd_tables import CrowdColumns
    from transforms.analyzer import arithmetic

    monkeypatch.setattr(analyze_pipeline, "PICTURE_BATCH_ROWS", batch_rows)
    one_hot, tree = load_recipe("small_one_hot_rappor"), load_recipe("small_longitudinal")
    book = arithmetic.RecipeBook([one_hot, tree])
    day = 86_400_000
    tables = []
    for instance in (0, 1):
        for window in range(6):
            start = rf.T0 + window * day
            tables.append((instance, [
                {"window_start_ms": start, "window_end_ms": start + day, "instance": instance,
                 "channel": recipe.channel, "recipe_id": recipe.id,
                 "crowd_id": None if i == 0 else f"c{(i * 7919 + window) % 997}",
                 "status": "withheld" if i % 4 == 3 else "released",
                 "respondents_released": 9, "messages_released": 9}
                for recipe in (one_hot, tree) for i in range(150)
            ]))  # fmt: skip
    by_dicts = analyze_pipeline.ReleaseSelection(book)
    by_columns = analyze_pipeline.ReleaseSelection(book)
    for instance, rows in tables:
        by_dicts.add(instance, rows)
        by_columns.add(instance, CrowdColumns(pa.Table.from_pylist(rows)))
    chosen = by_dicts.result()
    assert len(chosen[0]) == 2 * 24
    assert by_columns.result() == chosen


@pytest.mark.parametrize("pending_rows", [2, 1 << 12])
def test_the_columnar_count_check_agrees_with_the_crowd_by_crowd_one(
    pending_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline adds record blobs with Arrow (folding as it goes) and compares a bucket's
    records with its table's stated counts by joins; on random buckets (null crowd IDs,
    withheld crowds, counts off by one, crowds missing on either side) it adds up what dicts
    add up, and agrees exactly when crowd_count_problem finds nothing."""
    import random

    from pipelines import release_counts as rc
    from transforms.analyzer.aggregate import (
        pack_crowd_records,
        unpack_crowd_record_table,
        unpack_crowd_records,
    )

    monkeypatch.setattr(rc, "_PENDING_ROWS", pending_rows)  # 2: folds after every few batches
    rng = random.Random(3)
    agreed = 0
    for case in range(300):
        keys = [(rf.T0, rf.T0 + 9, "ch", "r@1", None if i == 0 else f"c{i}")
                for i in range(rng.randint(1, 12))]  # fmt: skip
        stated = {key: rng.choice([-1, 0, 1, 2, 5]) if case % 2 else rng.randint(1, 5)
                  for key in keys}  # fmt: skip
        read = {key: count for key, count in stated.items() if count > 0}
        if case % 3 == 0:
            key = rng.choice(keys + [(rf.T0, rf.T0 + 9, "ch", "r@1", "stranger")])
            read[key] = read.get(key, 0) + rng.choice([1, -1, 2])
            read = {k: v for k, v in read.items() if v > 0}
        parts, total = [], {}
        for key, count in read.items():  # the records split over batches
            for piece in (count // 2, count - count // 2):
                if piece:
                    parts.append(pack_crowd_records({key: piece}))
        combine = rc._AddCrowdRecords()
        accumulator = combine.create_accumulator()
        for part in parts:
            accumulator = combine.add_input(accumulator, part)
            for key, count in unpack_crowd_records(part).items():
                total[key] = total.get(key, 0) + count
        added = combine.extract_output(combine.merge_accumulators([combine.compact(accumulator)]))
        assert unpack_crowd_records(added) == total == read
        problem = rc.crowd_count_problem("rel", stated, read)
        found = list(rc._problems((("rel", None), {"read": [added], "stated": [
            pack_crowd_records(stated)]})))  # fmt: skip
        assert found == ([] if problem is None else [problem])
        columns = rc._agree(unpack_crowd_record_table(pack_crowd_records(stated)),
                            unpack_crowd_record_table(added))  # fmt: skip
        assert columns == (problem is None)  # the joins alone decide agreement
        agreed += problem is None
    assert 50 < agreed < 250


def test_a_batch_counted_from_its_crowd_groups_has_arrows_counts() -> None:
    """crowd_record_table given the batch's crowd_groups counts the crowds Arrow's group-by
    counts (as sets of rows), nulls included (-1 and null, "" and null stay apart)."""
    import random

    import pyarrow as pa

    from transforms.analyzer import arithmetic
    from transforms.analyzer.aggregate import CROWD_KEY_COLUMNS, crowd_record_table

    rng = random.Random(5)
    for case in range(200):
        rows = rng.randint(1, 40)
        pick = [[rf.T0, rf.T0 + 1], [rf.T0 + 9], ["ch", "dh"], ["r@1"], ["c1", "c2", "c3"]]
        if case % 4 == 0:  # nulls beside values that -1 codes or empty text could stand for
            pick = [[-1, None], [rf.T0 + 9, None], ["", None], ["r@1"], ["c1", "", None]]
        columns = {name: [rng.choice(values) for _ in range(rows)]
                   for name, values in zip(CROWD_KEY_COLUMNS, pick, strict=True)}  # fmt: skip
        types = [pa.int64(), pa.int64(), pa.string(), pa.string(), pa.string()]
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(columns[name], kind)
                for name, kind in zip(CROWD_KEY_COLUMNS, types, strict=True)
            ],
            names=list(CROWD_KEY_COLUMNS),
        )
        groups = arithmetic.crowd_groups([batch.column(name) for name in CROWD_KEY_COLUMNS])
        expected = crowd_record_table(batch).to_pylist()
        found = crowd_record_table(batch, groups).to_pylist()
        assert sorted(map(repr, found)) == sorted(map(repr, expected))
        assert sum(row["records"] for row in found) == rows
