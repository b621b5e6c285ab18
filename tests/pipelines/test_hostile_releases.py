"""Hostile release directories handed to ``esa analyze`` (issue #11: transactional releases, the
analyzer handed only what it may see, edges refused). One real release is made with ``esa
shuffle``; each case copies it, damages it in one way and expects one error line, exit 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines import cli
from schemas import release as rel
from tests.transforms import report_factory as rf

Mutation = Callable[[Path], None]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A committed release of one crowd of 30 respondents (and its private sibling)."""
    root = tmp_path_factory.mktemp("hostile")
    recipe, fields = rf.write_recipe(root, "hostile_test", min_crowd_size=5)
    (root / "reports").mkdir()
    rf.write_reports(root / "reports" / "a.avro", rf.crowd(30, 2, **fields))
    argv = ["shuffle", "--input", str(root / "reports" / "*.avro"), "--recipe", recipe]
    argv += ["--instance", "0"]
    assert cli.main([*argv, "--output", str(root / "rel"), "--crowd-threshold", "10"]) == 0
    return root / "rel", recipe


def _edit(change: Callable[[dict], None]) -> Mutation:
    def mutate(directory: Path) -> None:
        path = directory / rel.COMMIT_FILE
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    return mutate


def _crowd(key: str, value: object) -> Mutation:
    return _edit(lambda record: record["crowds"][0].__setitem__(key, value))


def _parameter(key: str, value: object) -> Mutation:
    return _edit(lambda record: record["parameters"].__setitem__(key, value))


def _message_file(directory: Path) -> Path:
    return next((directory / "messages").iterdir())


def _write_commit(text: str) -> Mutation:
    return lambda directory: (directory / rel.COMMIT_FILE).write_text(text)


CASES: list[tuple[str, Mutation, str]] = [
    ("deeply nested commit", _write_commit("[" * 100_000 + "]" * 100_000), "unreadable commit"),
    ("commit is a list", _write_commit("[1, 2]"), "not a commit record"),
    ("commit truncated", _write_commit('{"format": "esa-rel'), "unreadable commit"),
    ("instance 2^70", _edit(lambda r: r.__setitem__("instance", 2**70)), "instance"),
    ("threshold 0", _parameter("crowd_threshold", 0), "crowd_threshold"),
    ("threshold a string", _parameter("crowd_threshold", "100"), "crowd_threshold"),
    ("threshold 2^63", _parameter("crowd_threshold", 2**63), "crowd_threshold"),
    ("window_ms 0", _parameter("window_ms", 0), "window_ms"),
    ("n = 10^30", _crowd("respondents_released", 10**30), "respondents_released"),
    ("n below the threshold", _crowd("respondents_released", 3), "below the crowd_threshold"),
    ("n NaN", _crowd("respondents_released", float("nan")), "respondents_released"),
    ("n true", _crowd("respondents_released", True), "respondents_released"),
    ("path with ..", _edit(lambda r: r["files"][0].__setitem__("path", "../x.avro")), "relative"),
    ("absolute path", _edit(lambda r: r["files"][0].__setitem__("path", "/etc/hosts")), "relative"),
    (
        "copied file",
        lambda d: shutil.copy(_message_file(d), d / "messages" / "copy.avro"),
        "not listed",
    ),
    (
        "truncated file",
        lambda d: _message_file(d).write_bytes(_message_file(d).read_bytes()[:-9]),
        "bytes",
    ),
    ("zero-byte file", lambda d: _message_file(d).write_bytes(b""), "bytes"),
    ("dead letters inside", lambda d: (d / "dead_letter").mkdir(), "shuffler-private"),
    ("no commit", lambda d: (d / rel.COMMIT_FILE).unlink(), "uncommitted"),
]


@pytest.mark.parametrize(("mutate", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_release_is_refused_in_one_line(
    made: tuple[Path, str], tmp_path: Path, capsys, mutate: Mutation, words: str
) -> None:
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    mutate(copy)
    argv = ["analyze", "--input", str(copy), "--output", str(tmp_path / "an"), "--recipe", recipe]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("esa analyze: error:") and words in err[0], err


def test_the_undamaged_release_is_analyzed(made: tuple[Path, str], tmp_path: Path) -> None:
    release_dir, recipe = made
    argv = ["analyze", "--input", str(release_dir), "--output", str(tmp_path / "an"), "--recipe"]
    assert cli.main([*argv, recipe]) == 0
    summary = json.loads((tmp_path / "an" / "summary.json").read_text())
    [histogram] = [
        json.loads(line)
        for part in sorted((tmp_path / "an" / "reports.jsonl").glob("part-*"))
        for line in part.read_text().splitlines()
    ]
    # n is the commit's 30 (K = 4: n_eff = 30/4); the test payloads are not one-hot codes, so
    # all 60 messages are dead-lettered with a reason, and the counters add up.
    assert histogram["respondents_by_instance"] == {"0": 30}
    assert summary["metrics"]["read"] == summary["metrics"]["dead_lettered"] == 60
    assert summary["metrics"]["adds_up"]


def test_a_renamed_copy_of_a_release_is_read_and_refused_not_skipped(
    made: tuple[Path, str], tmp_path: Path, capsys
) -> None:
    release_dir, recipe = made
    shutil.copytree(release_dir, tmp_path / "root" / "instance=0")
    shutil.copytree(release_dir, tmp_path / "root" / "backup")
    argv = ["analyze", "--input", str(tmp_path / "root"), "--output", str(tmp_path / "an")]
    assert cli.main([*argv, "--recipe", recipe]) == 2
    assert "instance 0 released twice" in capsys.readouterr().err


@pytest.mark.parametrize("inside", ["rel/an", "rel/messages/an", "."])
def test_analysis_output_may_not_be_inside_or_around_a_release(
    made: tuple[Path, str], tmp_path: Path, capsys, inside: str
) -> None:
    release_dir, recipe = made
    copy = tmp_path / "rel"
    shutil.copytree(release_dir, copy)
    argv = ["analyze", "--input", str(copy), "--output", str(tmp_path / inside), "--recipe", recipe]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must not be inside" in err[0]
    assert rel.verify_release(str(copy)).records == 60  # the release is untouched


def test_shuffle_output_may_not_be_inside_or_around_its_input(
    made: tuple[Path, str], tmp_path: Path, capsys
) -> None:
    release_dir, recipe = made
    reports = release_dir.parent / "reports"
    for output in (reports / "out", reports.parent):
        argv = ["shuffle", "--input", f"{reports}/*.avro", "--output", str(output)]
        assert cli.main([*argv, "--recipe", recipe]) == 2
        assert "must not be inside" in capsys.readouterr().err
