"""A commit record's per-crowd figures must agree with the messages its files hold (issue #11).

One real release of two crowds (30 respondents x 2 messages, 20 x 2) is made with ``esa
shuffle``; each case edits only ``_COMMIT.json`` (the files keep their committed size and SHA-256,
and the release's total message count still matches) and expects ``esa analyze`` to refuse it in
one line naming the release and the crowd, exit 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.release_crowds import count_crowd_messages
from schemas import release as rel
from tests.transforms import report_factory as rf

Edit = Callable[[dict], None]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("crowds")
    recipe, fields = rf.write_recipe(root, "crowds_test", min_crowd_size=5)
    (root / "reports").mkdir()
    records = rf.crowd(30, 2, crowd_id="a", **fields)
    records += rf.crowd(20, 2, crowd_id="b", prefix="other", seed=1, **fields)
    rf.write_reports(root / "reports" / "a.avro", records)
    argv = ["shuffle", "--input", str(root / "reports" / "*.avro"), "--recipe", recipe]
    argv += ["--instance", "0", "--output", str(root / "rel"), "--crowd-threshold", "10"]
    assert cli.main(argv) == 0
    return root / "rel", recipe


def _crowds(record: dict) -> dict[str, dict]:
    return {crowd["crowd_id"]: crowd for crowd in record["crowds"]}


def _move(record: dict) -> None:
    # 10 of a's messages claimed by b, and b's n inflated 20 -> 200: the total still holds
    a, b = _crowds(record)["a"], _crowds(record)["b"]
    a["messages_released"] -= 10
    b.update(messages_released=b["messages_released"] + 10, respondents_released=200)


def _swap_counts(record: dict) -> None:
    a, b = _crowds(record)["a"], _crowds(record)["b"]
    a["messages_released"], b["messages_released"] = b["messages_released"], a["messages_released"]


def _relabel(record: dict) -> None:
    _crowds(record)["b"]["recipe_id"] = "image_grid_onehot@1"


def _rechannel(record: dict) -> None:
    _crowds(record)["b"]["channel"] = "other_channel"


def _remove(record: dict) -> None:
    b = _crowds(record)["b"]
    record["crowds"].remove(b)
    _crowds(record)["a"]["messages_released"] += b["messages_released"]


def _rename(record: dict) -> None:
    _crowds(record)["b"]["crowd_id"] = "c"


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


@pytest.mark.parametrize(("edit", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_commit_figures_that_disagree_with_the_files_are_refused(
    made: tuple[Path, str], tmp_path: Path, capsys, edit: Edit, words: str
) -> None:
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    path = copy / rel.COMMIT_FILE
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    # The release-wide checks pass: files unaltered, total messages unchanged.
    rel.verify_release(str(copy))
    assert _analyze(copy, recipe, tmp_path / "an") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("esa analyze: error: refusing release"), err
    assert str(copy) in err[0] and words in err[0] and '"crowd_id": "' in err[0], err
    assert not (tmp_path / "an" / "summary.json").exists()


def test_files_are_counted_per_crowd_key(made: tuple[Path, str]) -> None:
    release_dir, _ = made
    counts = count_crowd_messages(rel.verify_release(str(release_dir)).files, batch_records=7)
    assert sorted((key[4], n) for key, n in counts.items()) == [("a", 60), ("b", 40)]
    record = json.loads((release_dir / rel.COMMIT_FILE).read_text())
    assert {c["crowd_id"]: c["messages_released"] for c in record["crowds"]} == {"a": 60, "b": 40}


def test_the_untouched_release_is_accepted(made: tuple[Path, str], tmp_path: Path) -> None:
    release_dir, recipe = made
    assert _analyze(release_dir, recipe, tmp_path / "an") == 0
    summary = json.loads((tmp_path / "an" / "summary.json").read_text())
    assert summary["metrics"]["read"] == 100 and summary["metrics"]["adds_up"]
